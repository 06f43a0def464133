package kube

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// Pods of the load test: on sonde's node as many as a big node runs, and ten times as
// many elsewhere, which the field selector must keep away from it.
var (
	loadHere  = envInt("SONDE_KUBE_LOAD_HERE", 1000)
	loadThere = envInt("SONDE_KUBE_LOAD_THERE", 10000)
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n >= 0 {
		return n
	}
	return def
}

// loadPod is a pod of the size real ones have: labels, annotations, a container with
// environment, resources, ports, probes and mounts (about 2 KB as the API server stores it).
func loadPod(w workload, i int, node string) *corev1.Pod {
	p := w.pod(fmt.Sprintf("%s-%s-%05d", w.deployment, w.hash, i), node)
	p.Labels["app.kubernetes.io/part-of"] = "load"
	p.Labels["app.kubernetes.io/version"] = "1.2.3"
	p.Labels["tier"] = "web"
	p.Annotations = map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9090",
		"kubectl.kubernetes.io/restartedAt": "2026-11-01T10:00:00Z"}
	ctr := &p.Spec.Containers[0]
	for j := range 8 {
		ctr.Env = append(ctr.Env, corev1.EnvVar{Name: fmt.Sprintf("SETTING_%d", j), Value: "some-value-of-a-setting"})
	}
	ctr.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	ctr.Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}}
	probe := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intOrString("http")}}, PeriodSeconds: 10}
	ctr.LivenessProbe, ctr.ReadinessProbe = probe, probe
	ctr.VolumeMounts = []corev1.VolumeMount{{Name: "config", MountPath: "/etc/app"}}
	p.Spec.Volumes = []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}}}}
	return p
}

// createMany creates n pods with a few clients at once, reporting those of node running
// with a container id.
func createMany(t *testing.T, cs *kubernetes.Clientset, w workload, from, n int, node string, withStatus bool) {
	t.Helper()
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				cid := ""
				if withStatus {
					cid = fmt.Sprintf("%064x", i+1)
				}
				if _, err := tryCreatePod(cs, loadPod(w, i, node), cid); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for i := from; i < from+n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// TestLoad lists and watches the pods of a node among many: sonde's watcher must hold
// this node's pods only, and what it costs (the heap its metadata takes, the bytes of
// its list and watch, the time of its first list) is logged, for docs/performance.md.
func TestLoad(t *testing.T) {
	c := cluster(t)
	cs := adminClient(t, c)
	token := sondeToken(t, c)
	ensureNodes(t, cs, loadNode, "node-load-elsewhere")
	ensureNamespace(t, cs, "load")
	w := makeWorkload(t, cs, "load", "web", "86b7c5d4f9")

	start := time.Now()
	createMany(t, cs, w, 0, loadHere, loadNode, true)
	createMany(t, cs, w, loadHere, loadThere, "node-load-elsewhere", false)
	t.Logf("created %d pods on %s and %d on another node in %v", loadHere, loadNode, loadThere, time.Since(start).Round(time.Millisecond))

	proxy, err := c.NewProxy()
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cfg := c.Config(token)
	cfg.Host = proxy.URL()

	heapBefore := heapInUse()
	start = time.Now()
	r := runWatcher(t, loadNode, cfg)
	listTime := time.Since(start)
	listBytes := proxy.FromServer.Load()
	heapAfter := heapInUse()
	if n := len(r.Pods()); n != loadHere {
		t.Fatalf("the watcher holds %d pods after its first list, want this node's %d", n, loadHere)
	}
	metadata := heapAfter - heapBefore

	// Changes elsewhere cost the watcher nothing: the API server filters them out.
	ctx := context.Background()
	base := proxy.FromServer.Load()
	const changes = 500
	changeLabels(t, cs, w, loadHere, min(changes, loadThere), "elsewhere")
	elsewhere := proxy.FromServer.Load() - base

	// Changes here reach it, one event each.
	base = proxy.FromServer.Load()
	heard := r.changes.Load()
	changeLabels(t, cs, w, 0, min(changes, loadHere), "here")
	testenv.WaitFor(t, "the label changes on this node", waitTimeout, func() (bool, string) {
		n := r.changes.Load() - heard
		return n >= int64(min(changes, loadHere)), fmt.Sprintf("%d changes heard", n)
	})
	here := proxy.FromServer.Load() - base

	// What the list would be without the field selector: every node's pods.
	start = time.Now()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/pods").
		SetHeader("Accept", "application/vnd.kubernetes.protobuf").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	unfiltered := time.Since(start)

	lists, watches, _ := checkAudit(t, c, loadNode)
	t.Logf("LOAD %d pods here, %d elsewhere: first list and sync %v, %d bytes from the API server (TLS included); metadata heap %.1f MiB (%d B per pod); %d label changes elsewhere: %d bytes to sonde; %d here: %d bytes (%d per event); all pods listed without the selector: %.1f MiB protobuf in %v; %d lists, %d watches",
		loadHere, loadThere, listTime.Round(time.Millisecond), listBytes, float64(metadata)/(1<<20), metadata/int64(max(loadHere, 1)),
		min(changes, loadThere), elsewhere, min(changes, loadHere), here, here/int64(max(min(changes, loadHere), 1)),
		float64(len(raw))/(1<<20), unfiltered.Round(time.Millisecond), lists, watches)
	// Loose bounds, far above what is measured (docs/performance.md): they catch the
	// watcher keeping whole pods or other nodes' pods, not a slow machine.
	if perPod := metadata / int64(max(loadHere, 1)); perPod > 4096 {
		t.Errorf("the watcher's heap grew %d bytes per pod of this node: more than a trimmed pod's few hundred", perPod)
	}
	if elsewhere > int64(changes)*64 {
		t.Errorf("changes to other nodes' pods sent %d bytes to sonde: the field selector does not keep them away", elsewhere)
	}
	runtime.KeepAlive(r)
}

func changeLabels(t *testing.T, cs *kubernetes.Clientset, w workload, from, n int, value string) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				if err := tryLabelPod(cs, w.namespace, fmt.Sprintf("%s-%s-%05d", w.deployment, w.hash, i), "rollout", value); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := from; i < from+n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}

func intOrString(s string) intstr.IntOrString { return intstr.FromString(s) }

// heapInUse is the live heap after a full collection.
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

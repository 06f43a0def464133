package pipeline

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sonde-profiler/sonde/internal/cgroup"
	"github.com/sonde-profiler/sonde/internal/kube"
	"github.com/sonde-profiler/sonde/internal/kube/kubetest"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/trace"
)

const (
	testNode = "node-a"
	testUID  = "1c1e1b8a-7f2d-4f6e-9a3b-2c5d8e9f0a1b"
	testCID  = "3f2a9c0e5b7d4e1f8a6c2b9d0e7f1a3c5b8d2e4f6a9c1b3d5e7f9a2c4b6d8e0f"
)

func testPod(uid, name, ns string, labels map[string]string, cid string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID(uid), Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "checkout-7d9f8c6b5", Controller: ptr(true)}}},
		Spec:   corev1.PodSpec{NodeName: testNode},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + cid}}},
	}
}

func ptr[T any](v T) *T { return &v }

// runWatcher starts a watcher on a fake API server holding pods, and waits for its list.
func runWatcher(t *testing.T, pods ...*corev1.Pod) (*kube.Watcher, *kubetest.Server) {
	t.Helper()
	srv := kubetest.New(t, pods...)
	w, err := kube.New(kube.Config{NodeName: testNode, API: &kube.APIConfig{Host: srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(10 * time.Second); !w.Synced(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watcher did not sync")
		}
	}
	return w, srv
}

// service.name comes, in order, from the process context the process published, its
// own environment, the pod's app.kubernetes.io/name label, its app label, the
// container's name, the executable's.
func TestDescriberServiceName(t *testing.T) {
	labelled := testPod(testUID, "checkout-7d9f8c6b5-x2x9z", "shop", map[string]string{"app.kubernetes.io/name": "checkout", "app": "legacy", "pod-template-hash": "7d9f8c6b5"}, testCID)
	w, _ := runWatcher(t, labelled)
	d := describer{watcher: w}
	for _, tc := range []struct {
		name string
		proc trace.Process
		want string
		done bool
	}{
		{"published", trace.Process{Name: "java", PodUID: testUID, ContainerID: testCID, EnvServiceName: "cart",
			Published: map[string]string{"service.name": "cart-v2"}}, "cart-v2", true},
		{"environment", trace.Process{Name: "java", PodUID: testUID, ContainerID: testCID, EnvServiceName: "cart"}, "cart", true},
		{"pod label", trace.Process{Name: "java", PodUID: testUID, ContainerID: testCID}, "checkout", true},
		{"no pod", trace.Process{Name: "bash", ExePath: "/usr/bin/bash"}, "bash", true},
		{"pod not known yet", trace.Process{Name: "java", PodUID: "0000", ContainerID: testCID[1:] + "0"}, "java", false},
	} {
		p := tc.proc
		done := d.Describe(&p)
		if got := p.Attributes["service.name"]; got != tc.want || done != tc.done {
			t.Errorf("%s: service.name %q, complete %v; want %q, %v", tc.name, got, done, tc.want, tc.done)
		}
	}
	p := trace.Process{Name: "java", PodUID: testUID, ContainerID: testCID}
	d.Describe(&p)
	for k, want := range map[string]string{"k8s.pod.name": "checkout-7d9f8c6b5-x2x9z", "k8s.namespace.name": "shop", "k8s.container.name": "app",
		"k8s.deployment.name": "checkout", "k8s.node.name": testNode, "k8s.pod.uid": testUID} {
		if got := p.Attributes[k]; got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	// Without labels the container's name names the service; without API access, the executable.
	bare := testPod(testUID, "x", "shop", nil, testCID)
	w2, _ := runWatcher(t, bare)
	q := trace.Process{Name: "java", PodUID: testUID, ContainerID: testCID}
	describer{watcher: w2}.Describe(&q)
	r := trace.Process{Name: "java", PodUID: testUID, ContainerID: testCID}
	describer{}.Describe(&r)
	if q.Attributes["service.name"] != "app" || r.Attributes["service.name"] != "java" {
		t.Errorf("container name %q, no API %q; want app and java", q.Attributes["service.name"], r.Attributes["service.name"])
	}
}

type fakeCgroupFilter map[uint64]bool

func (f fakeCgroupFilter) AddCgroup(id uint64) error    { f[id] = true; return nil }
func (f fakeCgroupFilter) RemoveCgroup(id uint64) error { delete(f, id); return nil }

// The kernel's filter follows the pods that namespaces and a selector choose, as they come
// and go.
func TestPodFilterFollowsPods(t *testing.T) {
	root := t.TempDir()
	dirOf := func(uid string) string {
		return filepath.Join(root, "kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+strings.ReplaceAll(uid, "-", "_")+".slice")
	}
	ids := map[string]uint64{}
	for i, uid := range []string{"a-1", "b-2", "c-3"} {
		os.MkdirAll(dirOf(uid), 0o755)
		ids[dirOf(uid)] = uint64(100 + i)
	}
	w, srv := runWatcher(t,
		testPod("a-1", "web-1", "shop", map[string]string{"tier": "web"}, strings.Repeat("a", 64)),
		testPod("b-2", "db-1", "shop", map[string]string{"tier": "db"}, strings.Repeat("b", 64)),
		testPod("c-3", "web-2", "other", map[string]string{"tier": "web"}, strings.Repeat("c", 64)))
	cfg := &KubeConfig{NodeName: testNode, Metadata: true, CgroupRoot: root}
	if err := ParseKube(cfg, "shop", "tier=web", ""); err != nil {
		t.Fatal(err)
	}
	kernel := fakeCgroupFilter{}
	f := &podFilter{cfg: cfg, kernel: kernel, watcher: w, log: slog.New(slog.NewTextHandler(io.Discard, nil)), current: map[string]uint64{},
		idOf: func(p string) (uint64, error) {
			if id, ok := ids[p]; ok {
				return id, nil
			}
			return 0, fmt.Errorf("no id for %s", p)
		}}
	f.update()
	if len(kernel) != 1 || !kernel[100] {
		t.Fatalf("filter holds %v, want only web-1's cgroup (100)", kernel)
	}
	// A new web pod in the namespace joins; the first one leaves.
	uid := "d-4"
	os.MkdirAll(dirOf(uid), 0o755)
	ids[dirOf(uid)] = 103
	srv.Create(testPod(uid, "web-3", "shop", map[string]string{"tier": "web"}, strings.Repeat("d", 64)))
	srv.Delete("shop", "web-1")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		f.update()
		if len(kernel) == 1 && kernel[103] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("filter holds %v after the pods changed, want only web-3's cgroup (103)", kernel)
		}
	}
}

// A process in a pod's container cgroup is read with its pod's and container's ids, and
// described with what the API server says of them.
func TestProcessInPodGetsAttributes(t *testing.T) {
	testenv.RequireRoot(t)
	root, err := cgroup.Root("/proc/self/mountinfo")
	if err != nil {
		testenv.Unavailable(t, "no cgroup v2 here: %v", err)
	}
	pod := filepath.Join(root, "kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+strings.ReplaceAll(testUID, "-", "_")+".slice")
	ctr := filepath.Join(pod, "cri-containerd-"+testCID+".scope")
	if err := os.MkdirAll(ctr, 0o755); err != nil {
		testenv.Unavailable(t, "cannot make cgroups under %s: %v", root, err)
	}
	defer func() {
		os.Remove(ctr)
		os.Remove(pod)
		os.Remove(filepath.Dir(pod))
		os.Remove(filepath.Dir(filepath.Dir(pod)))
	}()
	sleeper := exec.Command("sleep", "30")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	if err := os.WriteFile(filepath.Join(ctr, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	w, _ := runWatcher(t, testPod(testUID, "checkout-7d9f8c6b5-x2x9z", "shop", map[string]string{"app.kubernetes.io/name": "checkout"}, testCID))
	procs := trace.NewProcesses(trace.ProcessConfig{Describer: describer{watcher: w}})
	ctx, cancel := context.WithCancel(context.Background())
	go procs.Run(ctx)
	defer cancel()
	procs.Prime(uint32(sleeper.Process.Pid))
	procs.Settle(ctx)
	p := procs.Process(uint32(sleeper.Process.Pid))
	if p == nil {
		t.Fatal("the process was not read")
	}
	if p.PodUID != testUID || p.ContainerID != testCID || p.Attributes["k8s.pod.name"] != "checkout-7d9f8c6b5-x2x9z" || p.Attributes["service.name"] != "checkout" {
		t.Errorf("process in the pod's container cgroup: %+v", p)
	}
}

package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	sondekube "github.com/sonde-profiler/sonde/internal/kube"
	"github.com/sonde-profiler/sonde/internal/testenv"
)

const (
	cidA = "3f1b7c2e9a4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7"
	cidB = "aa11bb22cc33dd44ee55ff6600771188aa99bb00cc11dd22ee33ff4400556677"
	cidC = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00"
	cidD = "d00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00dd00d"
	cidE = "e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1"
)

// waitTimeout bounds a broken test only; nothing asserts how fast events arrive.
const waitTimeout = 2 * time.Minute

// running is a Watcher run by a test.
type running struct {
	*sondekube.Watcher
	changes atomic.Int64
	stop    func() error
}

// apiConfig is the part of a client-go config sonde's watcher takes.
func apiConfig(c *rest.Config) *sondekube.APIConfig {
	return &sondekube.APIConfig{Host: c.Host, BearerToken: c.BearerToken, CAData: c.CAData,
		Insecure: c.Insecure, ServerName: c.ServerName}
}

// runWatcher runs sonde's watcher for node with cfg and waits for its first list.
func runWatcher(t *testing.T, node string, cfg *rest.Config) *running {
	t.Helper()
	w, err := sondekube.New(sondekube.Config{NodeName: node, API: apiConfig(cfg), OnError: func(err error) { t.Logf("watcher: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	r := &running{Watcher: w}
	w.OnChange(func() { r.changes.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	var once bool
	r.stop = func() error {
		if once {
			return nil
		}
		once = true
		cancel()
		return <-errc
	}
	t.Cleanup(func() { r.stop() })
	testenv.WaitFor(t, "the watcher's first list", waitTimeout, func() (bool, string) {
		select {
		case err := <-errc:
			errc <- err
			t.Fatalf("the watcher stopped: %v", err)
		default:
		}
		return w.Synced(), ""
	})
	return r
}

// names returns the sorted names of the pods the watcher knows.
func (r *running) names() []string {
	var out []string
	for _, p := range r.Pods() {
		out = append(out, p.Name)
	}
	sort.Strings(out)
	return out
}

// waitPods waits until the watcher knows exactly the pods named.
func (r *running) waitPods(t *testing.T, what string, want ...string) {
	t.Helper()
	sort.Strings(want)
	testenv.WaitFor(t, what, waitTimeout, func() (bool, string) {
		got := r.names()
		return slices.Equal(got, want), fmt.Sprintf("pods %v, want %v", got, want)
	})
}

func (r *running) pod(name string) (sondekube.Pod, bool) {
	for _, p := range r.Pods() {
		if p.Name == name {
			return p, true
		}
	}
	return sondekube.Pod{}, false
}

// TestWatcherAsServiceAccount runs sonde's watcher with the token the API server
// issues to the ServiceAccount of deploy/kubernetes, through a proxy the test can cut:
// it must see exactly this node's pods, name their Deployment through the ReplicaSet,
// follow adds, deletes and label changes, come back after an API server restart and
// after a watch expired by compaction (410 Gone, then a new list), and never ask for
// other nodes' pods.
func TestWatcherAsServiceAccount(t *testing.T) {
	c := cluster(t)
	cs := adminClient(t, c)
	token := sondeToken(t, c)
	ensureNodes(t, cs, thisNode, otherNode)
	node, err := cs.CoreV1().Nodes().Get(context.Background(), thisNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ensureNamespace(t, cs, "shop")
	ensureNamespace(t, cs, "batch")
	ensureNamespace(t, cs, "kube-system")
	checkout := makeWorkload(t, cs, "shop", "checkout", "7d9f8c6b5")
	report := makeWorkload(t, cs, "batch", "report", "5c4b3a2d1")
	a := createPod(t, cs, checkout.pod("checkout-7d9f8c6b5-aaaaa", thisNode), cidA)
	createPod(t, cs, checkout.pod("checkout-7d9f8c6b5-bbbbb", otherNode), cidB)
	createPod(t, cs, report.pod("report-5c4b3a2d1-ccccc", thisNode), "")

	proxy, err := c.NewProxy()
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cfg := c.Config(token)
	cfg.Host = proxy.URL()
	phase := time.Now()
	lap := func(what string) {
		t.Logf("%s: %v", what, time.Since(phase).Round(time.Millisecond))
		phase = time.Now()
	}
	w := runWatcher(t, thisNode, cfg)
	w.waitPods(t, "this node's pods", "checkout-7d9f8c6b5-aaaaa", "report-5c4b3a2d1-ccccc")

	pod, ctr, ok := w.Lookup(string(a.UID), cidA)
	if !ok || pod.Deployment != "checkout" || pod.ReplicaSet != "checkout-7d9f8c6b5" || pod.Namespace != "shop" ||
		pod.NodeName != thisNode || pod.AppName != "checkout" || ctr.Name != "app" {
		t.Errorf("Lookup(%s) = %+v %+v %v: want Deployment checkout through ReplicaSet checkout-7d9f8c6b5, container app", a.Name, pod, ctr, ok)
	}
	if _, c, ok := w.Lookup("", cidA); !ok || c.Name != "app" {
		t.Errorf("Lookup by container id alone = %+v %v", c, ok)
	}

	// A static pod's mirror, as the kubelet posts it: its cgroup carries the config hash,
	// not the mirror's UID.
	const hash = "6b3ffd12d0b7a8e3e7c1f2a9b4d5c6e7"
	mirror := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "etcd-" + thisNode, Namespace: "kube-system",
			Annotations:     map[string]string{"kubernetes.io/config.mirror": hash, "kubernetes.io/config.source": "file"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: thisNode, UID: node.UID, Controller: ptr(true)}}},
		Spec: corev1.PodSpec{NodeName: thisNode, Containers: []corev1.Container{{Name: "etcd", Image: "registry.k8s.io/etcd:3.7"}}},
	}
	createPod(t, cs, mirror, "")
	testenv.WaitFor(t, "the mirror pod by its config hash", waitTimeout, func() (bool, string) {
		p, _, ok := w.Lookup(hash, "")
		return ok && p.Name == mirror.Name, fmt.Sprintf("%+v %v", p, ok)
	})
	deletePod(t, cs, "kube-system", mirror.Name)

	// Adds here and there, a label change, a container starting, a delete.
	createPod(t, cs, checkout.pod("checkout-7d9f8c6b5-ddddd", thisNode), cidD)
	createPod(t, cs, checkout.pod("checkout-7d9f8c6b5-eeeee", otherNode), "")
	labelPod(t, cs, "shop", a.Name, "app.kubernetes.io/name", "checkout-v2")
	deletePod(t, cs, "batch", "report-5c4b3a2d1-ccccc")
	w.waitPods(t, "the added pod, without the deleted one", "checkout-7d9f8c6b5-aaaaa", "checkout-7d9f8c6b5-ddddd")
	testenv.WaitFor(t, "the label change", waitTimeout, func() (bool, string) {
		p, _ := w.pod(a.Name)
		return p.AppName == "checkout-v2" && p.Labels["app.kubernetes.io/name"] == "checkout-v2", fmt.Sprintf("%+v", p)
	})
	if _, c, ok := w.Lookup("", cidD); !ok || c.Name != "app" {
		t.Errorf("the added pod's container: Lookup = %+v %v", c, ok)
	}

	lap("first list, adds, label change, delete")
	// The API server restarts; the watch resumes or lists again.
	c.StopAPIServer()
	lap("stop")
	if err := c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	lap("start")
	createPod(t, cs, checkout.pod("checkout-7d9f8c6b5-fffff", thisNode), "")
	w.waitPods(t, "a pod added after the API server restarted",
		"checkout-7d9f8c6b5-aaaaa", "checkout-7d9f8c6b5-ddddd", "checkout-7d9f8c6b5-fffff")

	old := createPod(t, cs, report.pod("report-5c4b3a2d1-hhhhh", thisNode), cidC)
	w.waitPods(t, "a pod to be made again",
		"checkout-7d9f8c6b5-aaaaa", "checkout-7d9f8c6b5-ddddd", "checkout-7d9f8c6b5-fffff", "report-5c4b3a2d1-hhhhh")
	lap("API server restart")
	// The watcher loses its connection; meanwhile pods change, etcd's history is
	// compacted and the API server restarts, so that its watch cache starts past the
	// watcher's resource version: the watch it comes back with gets 410 Gone, and only a
	// new list tells it what happened.
	listsBefore, _, _ := checkAudit(t, c, thisNode)
	proxy.Cut()
	createPod(t, cs, checkout.pod("checkout-7d9f8c6b5-ggggg", thisNode), cidE)
	deletePod(t, cs, "shop", "checkout-7d9f8c6b5-ddddd")
	labelPod(t, cs, "shop", "checkout-7d9f8c6b5-fffff", "tier", "web")
	// A pod deleted and made again under the same name, as a StatefulSet does: the new
	// list has the name with another UID, which the informer reports as an update.
	deletePod(t, cs, "batch", "report-5c4b3a2d1-hhhhh")
	again := createPod(t, cs, report.pod("report-5c4b3a2d1-hhhhh", thisNode), "")
	if _, err := c.Compact(); err != nil {
		t.Fatal(err)
	}
	c.StopAPIServer()
	if err := c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	w.waitPods(t, "the changes made while the watch was cut",
		"checkout-7d9f8c6b5-aaaaa", "checkout-7d9f8c6b5-fffff", "checkout-7d9f8c6b5-ggggg", "report-5c4b3a2d1-hhhhh")
	testenv.WaitFor(t, "the pod made again under its new UID", waitTimeout, func() (bool, string) {
		_, _, ok := w.Lookup(string(again.UID), "")
		return ok, ""
	})
	if p, _, ok := w.Lookup(string(old.UID), ""); ok {
		t.Errorf("the pod deleted and made again while the watch was cut is still known by its old UID: %+v", p)
	}
	if _, _, ok := w.Lookup("", cidC); ok {
		t.Error("the container of the pod deleted and made again while the watch was cut is still known")
	}
	testenv.WaitFor(t, "the label set while the watch was cut", waitTimeout, func() (bool, string) {
		p, _ := w.pod("checkout-7d9f8c6b5-fffff")
		return p.Labels["tier"] == "web", fmt.Sprintf("%+v", p)
	})
	if _, _, ok := w.Lookup("", cidD); ok {
		t.Error("the container of a pod deleted while the watch was cut is still known")
	}
	lap("cut, compaction, restart")

	// Exactly this node's pods, as the API server lists them.
	all, err := cs.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + thisNode})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range all.Items {
		want = append(want, p.Name)
	}
	w.waitPods(t, "the pods the API server lists for this node", want...)

	if err := w.stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
	lists, watches, _ := checkAudit(t, c, thisNode)
	if lists <= listsBefore {
		t.Errorf("%d lists of pods by sonde before the compacted watch, %d after: want a new list", listsBefore, lists)
	}
	if watches == 0 {
		t.Error("the audit log has no watch of pods by sonde")
	}
	t.Logf("sonde: %d lists and %d watches of pods, %d changes heard", lists, watches, w.changes.Load())
}

// TestWatcherWithoutRBAC runs the watcher as a ServiceAccount no role binds: the
// API server refuses the list, and Run says sonde has no API access.
func TestWatcherWithoutRBAC(t *testing.T) {
	c := cluster(t)
	cs := adminClient(t, c)
	sondeToken(t, c) // the namespace
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(sondeNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(sondeNamespace).CreateToken(ctx, "nobody",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := sondekube.New(sondekube.Config{NodeName: thisNode, API: apiConfig(c.Config(tr.Status.Token)), DenialGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	if err := w.Run(ctx); !errors.Is(err, sondekube.ErrNoAPIAccess) {
		t.Errorf("Run as a ServiceAccount without a role = %v, want ErrNoAPIAccess", err)
	}
}

// TestWatcherStartsBesideRestartingAPIServer starts sonde's watcher while the API server
// is down and lets it come up. A restarted API server refuses every ServiceAccount (403,
// "clusterrole not found") for some milliseconds while its RBAC caches fill (seen here
// 1.67 s after its start, for 10 ms, before /readyz): a first list that falls there must
// be retried (TestWatcherWaitsForRoleBinding makes the refusal certain).
func TestWatcherStartsBesideRestartingAPIServer(t *testing.T) {
	c := cluster(t)
	cs := adminClient(t, c)
	token := sondeToken(t, c)
	ensureNodes(t, cs, restartNode)
	ensureNamespace(t, cs, "restart")
	wl := makeWorkload(t, cs, "restart", "api", "4d3c2b1a0")
	createPod(t, cs, wl.pod("api-4d3c2b1a0-zzzzz", restartNode), "")

	c.StopAPIServer()
	w, err := sondekube.New(sondekube.Config{NodeName: restartNode, API: apiConfig(c.Config(token))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if err := c.LaunchAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitAPIServer(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the watcher's first list", waitTimeout, func() (bool, string) {
		select {
		case err := <-errc:
			errc <- nil
			t.Fatalf("the watcher gave up: %v", err)
		default:
		}
		return w.Synced(), ""
	})
	if got := len(w.Pods()); got != 1 {
		t.Errorf("%d pods, want 1", got)
	}
	lists, _, refused := checkAudit(t, c, restartNode)
	t.Logf("%d lists of pods, %d refused while the API server started", lists, refused)
}

// TestWatcherWaitsForRoleBinding starts the watcher as a ServiceAccount whose binding to
// sonde's ClusterRole comes a moment later, as when the DaemonSet's pods start before
// the RBAC objects applied with them are in the authorizer's cache, or the API server
// has just restarted: the first lists are refused, and the watcher must keep trying
// rather than go without metadata until sonde restarts.
func TestWatcherWaitsForRoleBinding(t *testing.T) {
	c := cluster(t)
	cs := adminClient(t, c)
	sondeToken(t, c) // sonde's ClusterRole
	ensureNodes(t, cs, restartNode)
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(sondeNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(sondeNamespace).CreateToken(ctx, "late",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := sondekube.New(sondekube.Config{NodeName: restartNode, API: apiConfig(c.Config(tr.Status.Token))})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- w.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Bind once the API server has refused the account at least once.
	testenv.WaitFor(t, "the API server to refuse the unbound account", waitTimeout, func() (bool, string) {
		events, err := c.Audit("system:serviceaccount:" + sondeNamespace + ":late")
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events {
			if e.ResponseStatus != nil && e.ResponseStatus.Code == 403 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d requests audited", len(events))
	})
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sonde-late"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "sonde"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "late", Namespace: sondeNamespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, "the watcher's first list once bound", waitTimeout, func() (bool, string) {
		select {
		case err := <-errc:
			errc <- nil
			t.Fatalf("the watcher gave up: %v", err)
		default:
		}
		return w.Synced(), ""
	})
}

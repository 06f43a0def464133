package kube

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/sonde-profiler/sonde/internal/kube/kubetest"
)

const (
	node  = "node-a"
	other = "node-b"
	cidA  = "3f1b7c2e9a4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7"
	cidB  = "aa11bb22cc33dd44ee55ff6600771188aa99bb00cc11dd22ee33ff4400556677"
	cidI  = "1111111111111111111111111111111111111111111111111111111111111111"
	cidE  = "2222222222222222222222222222222222222222222222222222222222222222"
)

// deploymentPod is a pod as a Deployment's ReplicaSet makes it, with an init, a
// regular and an ephemeral container.
func deploymentPod(uid, name, nodeName string) *corev1.Pod {
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "shop", UID: k8stypes.UID(uid),
			Labels: map[string]string{LabelAppName: "checkout", LabelApp: "checkout-legacy",
				labelPodTemplateHash: "7d9f8c6b5", "unrelated": "dropped"},
			Annotations:     map[string]string{"big": "dropped"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "checkout-7d9f8c6b5", UID: "rs", Controller: &yes}},
		},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "app", Image: "checkout:1"}}},
		Status: corev1.PodStatus{
			Phase:                      corev1.PodRunning,
			InitContainerStatuses:      []corev1.ContainerStatus{{Name: "migrate", ContainerID: "cri-o://" + cidI}},
			ContainerStatuses:          []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + cidA, Image: "checkout:1"}},
			EphemeralContainerStatuses: []corev1.ContainerStatus{{Name: "debugger", ContainerID: "docker://" + cidE}},
		},
	}
}

// waitFor polls cond: the watcher applies events on its own goroutine. The deadline only
// bounds a broken test; nothing asserts how fast events arrive.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func start(t *testing.T, w *Watcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitFor(t, "the first list", w.Synced)
}

// newWatcher makes a watcher of node's pods on srv.
func newWatcher(t *testing.T, srv *kubetest.Server, grace time.Duration) *Watcher {
	t.Helper()
	w, err := New(Config{NodeName: node, API: &APIConfig{Host: srv.URL}, DenialGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// requests counts the lists and watches srv served, and fails the test on any that is
// not for this node's pods in all namespaces.
func requests(t *testing.T, srv *kubetest.Server) (lists, watches int) {
	t.Helper()
	for _, u := range srv.Requests() {
		q := u.Query()
		if u.Path != "/api/v1/pods" || q.Get("fieldSelector") != "spec.nodeName="+node {
			t.Errorf("request %s: want /api/v1/pods with fieldSelector=spec.nodeName=%s", u, node)
		}
		if q.Get("watch") == "true" {
			watches++
			if q.Get("allowWatchBookmarks") != "true" || q.Get("resourceVersion") == "" {
				t.Errorf("watch %s: want bookmarks, from a resource version", u)
			}
		} else {
			lists++
		}
	}
	return lists, watches
}

// TestWatcherFollowsPods lists this node's pods, then follows adds, updates and deletes
// through the watch, asking for this node's pods only.
func TestWatcherFollowsPods(t *testing.T) {
	uidA, uidB, uidC := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90", "5e0c1d2f-3a4b-4c5d-8e9f-0a1b2c3d4e5f", "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
	srv := kubetest.New(t, deploymentPod(uidA, "checkout-7d9f8c6b5-x2x9z", node), deploymentPod(uidC, "elsewhere", other))
	w := newWatcher(t, srv, 0)
	changes := 0
	var mu sync.Mutex
	w.OnChange(func() { mu.Lock(); changes++; mu.Unlock() })
	start(t, w)

	pod, ctr, ok := w.Lookup(uidA, cidA)
	if !ok {
		t.Fatal("pod listed at start not found")
	}
	want := Pod{UID: uidA, Name: "checkout-7d9f8c6b5-x2x9z", Namespace: "shop", NodeName: node,
		AppName: "checkout", App: "checkout-legacy", Deployment: "checkout", ReplicaSet: "checkout-7d9f8c6b5"}
	if pod.Labels["app"] != "checkout-legacy" || pod.Labels["pod-template-hash"] == "" {
		t.Errorf("labels %v: want all of the pod's, for selectors", pod.Labels)
	}
	if withoutLabels := func(p Pod) Pod { p.Labels = nil; return p }; !reflect.DeepEqual(withoutLabels(pod), want) || ctr != (Container{ID: cidA, Name: "app"}) {
		t.Errorf("Lookup = %+v %+v, want %+v app", pod, ctr, want)
	}
	for id, name := range map[string]string{cidI: "migrate", cidE: "debugger"} {
		if _, c, ok := w.Lookup("", id); !ok || c.Name != name {
			t.Errorf("Lookup of container %s by id alone = %+v %v, want %s", id, c, ok, name)
		}
	}
	gotAttrs := Attributes(pod, ctr)
	for _, a := range []Attribute{{AttrPodName, want.Name}, {AttrNamespaceName, "shop"}, {AttrContainerName, "app"},
		{AttrDeploymentName, "checkout"}, {AttrNodeName, node}, {AttrPodUID, uidA}, {AttrContainerID, cidA}} {
		if !slices.Contains(gotAttrs, a) {
			t.Errorf("Attributes = %v, lacks %v", gotAttrs, a)
		}
	}
	if _, _, ok := w.Lookup(uidC, ""); ok {
		t.Error("another node's pod was listed")
	}

	// Added: a StatefulSet's pod, not started yet.
	b := deploymentPod(uidB, "db-0", node)
	b.OwnerReferences[0].Kind, b.OwnerReferences[0].Name = "StatefulSet", "db"
	b.Status = corev1.PodStatus{}
	srv.Create(b)
	waitFor(t, "the added pod", func() bool { _, _, ok := w.Lookup(uidB, ""); return ok })
	if p, c, _ := w.Lookup(uidB, cidB); p.StatefulSet != "db" || p.Deployment != "" || c.Name != "" {
		t.Errorf("Lookup(db-0) = %+v %+v, want StatefulSet db and no container name yet", p, c)
	}
	// Updated: the container started.
	b.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "postgres", ContainerID: "containerd://" + cidB}}
	srv.Update(b)
	waitFor(t, "the container status", func() bool { _, c, _ := w.Lookup(uidB, cidB); return c.Name == "postgres" })
	// Deleted.
	srv.Delete("shop", "checkout-7d9f8c6b5-x2x9z")
	waitFor(t, "the deletion", func() bool { _, _, ok := w.Lookup(uidA, ""); return !ok })
	if _, _, ok := w.Lookup("", cidA); ok {
		t.Error("a deleted pod's container is still found")
	}
	mu.Lock()
	if changes < 4 {
		t.Errorf("OnChange heard %d changes, want the list and three events", changes)
	}
	mu.Unlock()
	if lists, watches := requests(t, srv); lists != 1 || watches != 1 {
		t.Errorf("%d lists and %d watches, want one of each", lists, watches)
	}
}

// A watch the server ends (its timeout) is taken up again from the last version seen,
// with no new list; a watch from a version compacted away (410 Gone) lists again, and
// the new list forgets what went while the watch was down, including a pod deleted and
// made again under its name with another UID (a StatefulSet's; seen against a real API
// server, test/kube).
func TestWatcherResumesAndRelists(t *testing.T) {
	oldUID, newUID, uidB := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90", "5e0c1d2f-3a4b-4c5d-8e9f-0a1b2c3d4e5f", "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
	srv := kubetest.New(t, deploymentPod(oldUID, "db-0", node), deploymentPod(uidB, "web-1", node))
	w := newWatcher(t, srv, 0)
	start(t, w)
	waitFor(t, "the first watch", func() bool { _, watches := requests(t, srv); return watches == 1 })

	srv.CloseWatches()
	c := deploymentPod("c0c0c0c0-5b7f-4c1e-9a3d-2f6b8e7c1a90", "web-2", node)
	c.Status = corev1.PodStatus{}
	srv.Create(c)
	waitFor(t, "the pod made after the watch ended", func() bool { _, _, ok := w.Lookup(string(c.UID), ""); return ok })
	if lists, watches := requests(t, srv); lists != 1 || watches != 2 {
		t.Errorf("%d lists and %d watches after the server ended the watch, want 1 and 2", lists, watches)
	}

	// While no watch is open: db-0 is made again, web-1 goes, and the events are
	// compacted away.
	srv.Refuse(func(r *http.Request) int {
		if r.URL.Query().Get("watch") == "true" {
			return http.StatusServiceUnavailable
		}
		return 0
	})
	srv.CloseWatches()
	srv.Delete("shop", "db-0")
	srv.Create(deploymentPod(newUID, "db-0", node))
	srv.Delete("shop", "web-1")
	srv.Compact()
	srv.Refuse(nil)
	waitFor(t, "the new list", func() bool { _, _, ok := w.Lookup(newUID, ""); return ok })
	if _, _, ok := w.Lookup(oldUID, ""); ok {
		t.Error("db-0's old UID is still known")
	}
	if _, _, ok := w.Lookup(uidB, ""); ok {
		t.Error("web-1, deleted while the watch was down, is still known")
	}
	if _, c, ok := w.Lookup(newUID, cidA); !ok || c.Name != "app" || len(w.Pods()) != 2 {
		t.Errorf("Lookup(new UID) = %+v %v, %d pods: want db-0 anew and web-2", c, ok, len(w.Pods()))
	}
	if lists, _ := requests(t, srv); lists < 2 {
		t.Errorf("%d lists: want a new one after the 410", lists)
	}
}

func TestStaticPodByConfigHash(t *testing.T) {
	uid, hash := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90", "6b3ffd12d0b7a8e3e7c1f2a9b4d5c6e7"
	p := deploymentPod(uid, "etcd-node-a", node)
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "Node", Name: node}}
	p.Annotations = map[string]string{annotationMirror: hash}
	w := newWatcher(t, kubetest.New(t, p), 0)
	start(t, w)
	if got, c, ok := w.Lookup(hash, cidA); !ok || got.UID != uid || c.Name != "app" {
		t.Errorf("Lookup by config hash = %+v %+v %v, want the mirror pod %s", got, c, ok, uid)
	}
}

func TestRunWithoutAccess(t *testing.T) {
	srv := kubetest.New(t)
	srv.Refuse(func(*http.Request) int { return http.StatusForbidden })
	w := newWatcher(t, srv, time.Millisecond)
	if err := w.Run(context.Background()); !errors.Is(err, ErrNoAPIAccess) {
		t.Errorf("Run = %v, want ErrNoAPIAccess", err)
	}
}

// An API server that has just started refuses everyone until its RBAC caches have
// synced (seen against a real one, test/kube): refusals that end within the grace
// are retried, and the watcher lists the pods once they are let through.
func TestRunRetriesEarlyRefusals(t *testing.T) {
	uid := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90"
	srv := kubetest.New(t, deploymentPod(uid, "checkout-7d9f8c6b5-x2x9z", node))
	var refused int
	srv.Refuse(func(*http.Request) int {
		if refused < 2 {
			refused++
			return http.StatusForbidden
		}
		return 0
	})
	w := newWatcher(t, srv, 0)
	var errs []error
	w.onError = func(err error) { errs = append(errs, err) }
	start(t, w)
	if _, _, ok := w.Lookup(uid, ""); !ok || refused != 2 || len(errs) < 2 {
		t.Errorf("after %d refusals (%d said): pod found %v, want it listed after the second", refused, len(errs), ok)
	}
}

// A token file is read again for each request: the kubelet rotates a projected
// service-account token in place.
func TestTokenFileRotates(t *testing.T) {
	srv := kubetest.New(t, deploymentPod("0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90", "web-1", node))
	var mu sync.Mutex
	var seen []string
	srv.Refuse(func(r *http.Request) int {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.Header.Get("Authorization"))
		return 0
	})
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("first\n"), 0o600)
	w, err := New(Config{NodeName: node, API: &APIConfig{Host: srv.URL, BearerTokenFile: tok}})
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	os.WriteFile(tok, []byte("second"), 0o600)
	srv.CloseWatches()
	waitFor(t, "a request with the new token", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(seen, "Bearer second")
	})
	mu.Lock()
	defer mu.Unlock()
	if seen[0] != "Bearer first" {
		t.Errorf("first request presented %q, want the token file's", seen[0])
	}
}

func TestNewOutsideCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := New(Config{NodeName: node}); !errors.Is(err, ErrNoAPIAccess) {
		t.Errorf("New = %v, want ErrNoAPIAccess", err)
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New without a node name: want an error")
	}
	for _, host := range []string{"", "127.0.0.1:6443", "ftp://x"} {
		if _, err := New(Config{NodeName: node, API: &APIConfig{Host: host}}); err == nil {
			t.Errorf("New with host %q: want an error", host)
		}
	}
	if _, err := New(Config{NodeName: node, API: &APIConfig{Host: "https://x", CAData: []byte("not PEM")}}); err == nil {
		t.Error("New with a CA that is no PEM: want an error")
	}
}

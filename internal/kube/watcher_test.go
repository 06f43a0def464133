package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
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

// waitFor polls cond: informers apply events on their own goroutine. The deadline only
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

// TestWatcherFakeClientset follows pod add, update and delete through client-go's fake
// clientset, and checks that every list and watch asks for this node's pods only.
func TestWatcherFakeClientset(t *testing.T) {
	uidA, uidB, uidC := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90", "5e0c1d2f-3a4b-4c5d-8e9f-0a1b2c3d4e5f", "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
	cs := fake.NewClientset(deploymentPod(uidA, "checkout-7d9f8c6b5-x2x9z", node))
	watching := make(chan struct{}, 10)
	cs.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		watching <- struct{}{}
		return false, nil, nil
	})
	w, err := New(Config{NodeName: node, Pods: cs.CoreV1().Pods("")})
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	<-watching // events created before the fake's watch starts would be lost

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

	// Added: a StatefulSet's pod here, and a pod on another node that must not be kept
	// even though the fake clientset, unlike the API server, ignores field selectors.
	ctx := context.Background()
	b := deploymentPod(uidB, "db-0", node)
	b.OwnerReferences[0].Kind, b.OwnerReferences[0].Name = "StatefulSet", "db"
	b.Status = corev1.PodStatus{} // not started yet: no container ids
	if _, err := cs.CoreV1().Pods("shop").Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("shop").Create(ctx, deploymentPod(uidC, "elsewhere", other), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the added pod", func() bool { _, _, ok := w.Lookup(uidB, ""); return ok })
	if p, c, _ := w.Lookup(uidB, cidB); p.StatefulSet != "db" || p.Deployment != "" || c.Name != "" {
		t.Errorf("Lookup(db-0) = %+v %+v, want StatefulSet db and no container name yet", p, c)
	}

	// Updated: the container started.
	b.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "postgres", ContainerID: "containerd://" + cidB}}
	if _, err := cs.CoreV1().Pods("shop").UpdateStatus(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the container status", func() bool { _, c, _ := w.Lookup(uidB, cidB); return c.Name == "postgres" })

	// Deleted.
	if err := cs.CoreV1().Pods("shop").Delete(ctx, "checkout-7d9f8c6b5-x2x9z", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion", func() bool { _, _, ok := w.Lookup(uidA, ""); return !ok })
	if _, _, ok := w.Lookup("", cidA); ok {
		t.Error("a deleted pod's container is still found")
	}
	if _, _, ok := w.Lookup(uidC, cidA); ok {
		t.Error("another node's pod was kept")
	}

	var lists, watches int
	for _, a := range cs.Actions() {
		if a.GetResource().Resource != "pods" || (a.GetVerb() != "list" && a.GetVerb() != "watch") {
			continue
		}
		var fs string
		switch a := a.(type) {
		case k8stesting.ListAction:
			fs = a.GetListRestrictions().Fields.String()
			lists++
		case k8stesting.WatchAction:
			fs = a.GetWatchRestrictions().Fields.String()
			watches++
		}
		if fs != "spec.nodeName="+node || a.GetNamespace() != "" {
			t.Errorf("%s pods in namespace %q with field selector %q, want all namespaces, spec.nodeName=%s", a.GetVerb(), a.GetNamespace(), fs, node)
		}
	}
	if lists == 0 || watches == 0 {
		t.Errorf("%d lists and %d watches of pods, want both", lists, watches)
	}
}

func TestStaticPodByConfigHash(t *testing.T) {
	uid, hash := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90", "6b3ffd12d0b7a8e3e7c1f2a9b4d5c6e7"
	p := deploymentPod(uid, "etcd-node-a", node)
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "Node", Name: node}}
	p.Annotations = map[string]string{annotationMirror: hash}
	w, err := New(Config{NodeName: node, Pods: fake.NewClientset(p).CoreV1().Pods("")})
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	if got, c, ok := w.Lookup(hash, cidA); !ok || got.UID != uid || c.Name != "app" {
		t.Errorf("Lookup by config hash = %+v %+v %v, want the mirror pod %s", got, c, ok, uid)
	}
}

func TestRunWithoutAccess(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("RBAC: no"))
	})
	w, err := New(Config{NodeName: node, Pods: cs.CoreV1().Pods(""), DenialGrace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); !errors.Is(err, ErrNoAPIAccess) {
		t.Errorf("Run = %v, want ErrNoAPIAccess", err)
	}
}

// An API server that has just started refuses everyone until its RBAC caches have
// synced (seen against a real one, test/kube): refusals that end within the grace
// are retried, and the watcher lists the pods once they are let through.
func TestRunRetriesEarlyRefusals(t *testing.T) {
	uid := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90"
	cs := fake.NewClientset(deploymentPod(uid, "checkout-7d9f8c6b5-x2x9z", node))
	var refused int
	cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refused < 2 {
			refused++
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`RBAC: clusterrole.rbac.authorization.k8s.io "sonde" not found`))
		}
		return false, nil, nil
	})
	w, err := New(Config{NodeName: node, Pods: cs.CoreV1().Pods("")})
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	if _, _, ok := w.Lookup(uid, ""); !ok || refused != 2 {
		t.Errorf("after %d refusals: pod found %v, want it listed after the second", refused, ok)
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
}

// TestWatcherOverHTTP runs the client New makes against an HTTP server that answers
// like the API server, and checks the requests themselves: every one lists or watches
// pods in all namespaces, with this node's field selector.
func TestWatcherOverHTTP(t *testing.T) {
	uidA, uidB := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90", "5e0c1d2f-3a4b-4c5d-8e9f-0a1b2c3d4e5f"
	events := make(chan string, 4)
	var (
		mu       sync.Mutex
		requests []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.URL.String())
		mu.Unlock()
		q := r.URL.Query()
		if r.URL.Path != "/api/v1/pods" || q.Get("fieldSelector") != "spec.nodeName="+node {
			http.Error(rw, "unexpected request", http.StatusBadRequest)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		if q.Get("watch") != "true" {
			a := deploymentPod(uidA, "checkout-7d9f8c6b5-x2x9z", node)
			a.ResourceVersion = "10"
			list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
				ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: []corev1.Pod{*a}}
			json.NewEncoder(rw).Encode(list)
			return
		}
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case e := <-events:
				fmt.Fprintln(rw, e)
				rw.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(srv.Close) // after start's cleanup has stopped the watch

	w, err := New(Config{NodeName: node, REST: &rest.Config{Host: srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	start(t, w)
	if p, c, ok := w.Lookup(uidA, cidA); !ok || p.Deployment != "checkout" || c.Name != "app" {
		t.Fatalf("listed pod: Lookup = %+v %+v %v", p, c, ok)
	}
	event := func(typ string, p *corev1.Pod) string {
		p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf(`{"type":%q,"object":%s}`, typ, b)
	}
	b := deploymentPod(uidB, "db-0", node)
	b.ResourceVersion = "11"
	b.Status.ContainerStatuses[0].ContainerID = "containerd://" + cidB
	events <- event("ADDED", b)
	a := deploymentPod(uidA, "checkout-7d9f8c6b5-x2x9z", node)
	a.ResourceVersion = "12"
	events <- event("DELETED", a)
	waitFor(t, "the watched add and delete", func() bool {
		_, _, added := w.Lookup(uidB, cidB)
		_, _, kept := w.Lookup(uidA, "")
		return added && !kept
	})

	mu.Lock()
	defer mu.Unlock()
	var lists, watches int
	for _, r := range requests {
		u, err := url.Parse(r)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		if u.Path != "/api/v1/pods" || q.Get("fieldSelector") != "spec.nodeName="+node {
			t.Errorf("request %s: want /api/v1/pods with fieldSelector=spec.nodeName=%s", r, node)
		}
		if q.Get("watch") == "true" {
			watches++
		} else {
			lists++
		}
	}
	if lists == 0 || watches == 0 {
		t.Errorf("requests %q: want a list and a watch", requests)
	}
}

// A relist that finds a pod's name under another UID (deleted and made again while the
// watch was down) is an update to the informer: the old UID must go (seen against a
// real API server, test/kube).
func TestUpdateWithNewUID(t *testing.T) {
	oldUID, newUID := "0d1c4a2e-5b7f-4c1e-9a3d-2f6b8e7c1a90", "5e0c1d2f-3a4b-4c5d-8e9f-0a1b2c3d4e5f"
	w, err := New(Config{NodeName: node, Pods: fake.NewClientset().CoreV1().Pods("")})
	if err != nil {
		t.Fatal(err)
	}
	before, _ := trim(deploymentPod(oldUID, "db-0", node))
	after, _ := trim(deploymentPod(newUID, "db-0", node))
	after.(*stored).containers = nil // not started yet
	w.put(before)
	w.replace(before, after)
	if _, _, ok := w.Lookup(oldUID, ""); ok {
		t.Error("the old UID is still known")
	}
	if _, _, ok := w.Lookup("", cidA); ok {
		t.Error("the old pod's container is still known")
	}
	if p, _, ok := w.Lookup(newUID, ""); !ok || len(w.Pods()) != 1 {
		t.Errorf("Lookup(new UID) = %+v %v, %d pods: want the new pod alone", p, ok, len(w.Pods()))
	}
}

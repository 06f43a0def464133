package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// ErrNoAPIAccess says pod metadata cannot be had: sonde does not run in a cluster, or
// its service account may not list pods. Attributes are then the ids from cgroup paths
// only; the caller says so once.
var ErrNoAPIAccess = errors.New("no access to the Kubernetes API")

// PodClient lists and watches pods. A client-go clientset's CoreV1().Pods("") is one;
// New makes a lighter one when Config.Pods is nil.
type PodClient interface {
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Config configures a Watcher.
type Config struct {
	// NodeName is this node's name (the pod's spec.nodeName, from the downward API):
	// only pods scheduled here are listed and watched.
	NodeName string
	// REST is how to reach the API server; nil means the in-cluster configuration (the
	// service account's token and CA, KUBERNETES_SERVICE_HOST and _PORT).
	REST *rest.Config
	// Pods, if set, is used instead of a client made from REST.
	Pods PodClient
	// DenialGrace is how long refusals of the first list (401, 403) are retried before
	// Run gives up with ErrNoAPIAccess; 0 means DefaultDenialGrace. An API server that
	// has just started refuses everyone until its RBAC caches have synced, and a new
	// ServiceAccount's binding may land after the DaemonSet's pods start: giving up on
	// the first refusal would leave sonde without metadata until it restarts.
	DenialGrace time.Duration
}

// DefaultDenialGrace is Config.DenialGrace's default.
const DefaultDenialGrace = 30 * time.Second

// Watcher keeps the metadata of this node's pods current.
type Watcher struct {
	node     string
	informer cache.SharedIndexInformer
	handler  cache.ResourceEventHandlerRegistration

	mu         sync.RWMutex
	pods       map[string]*Pod      // by pod UID, and by config hash for static pods
	containers map[string]container // by container id
	// podContainers lists each pod's container ids, to forget them with the pod.
	podContainers map[string][]string

	denied      chan error // a refusal DenialGrace after the first, before the first list succeeded
	denialGrace time.Duration
	firstDenial time.Time // of the refusals before the first list; zero when none

	// onChange, when set, hears of every pod added, changed or deleted, outside mu.
	onChange func()
}

// OnChange sets a function called after every change to the pods known; set it before Run.
func (w *Watcher) OnChange(f func()) { w.onChange = f }

// Pods returns the pods known now.
func (w *Watcher) Pods() []Pod {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]Pod, 0, len(w.pods))
	for uid, p := range w.pods {
		if uid == p.UID { // not the alias a static pod's config hash also names it by
			out = append(out, *p)
		}
	}
	return out
}

func (w *Watcher) changed() {
	if w.onChange != nil {
		w.onChange()
	}
}

type container struct {
	podUID, name string
}

// New prepares a Watcher for cfg.NodeName; Run starts it. Outside a cluster it returns
// an error wrapping ErrNoAPIAccess.
func New(cfg Config) (*Watcher, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("kube: no node name")
	}
	pods := cfg.Pods
	if pods == nil {
		rc := cfg.REST
		if rc == nil {
			var err error
			if rc, err = rest.InClusterConfig(); err != nil {
				return nil, fmt.Errorf("kube: %w: %w", ErrNoAPIAccess, err)
			}
		}
		var err error
		if pods, err = newPodClient(rc); err != nil {
			return nil, fmt.Errorf("kube: %w", err)
		}
	}
	w := &Watcher{
		node:          cfg.NodeName,
		pods:          map[string]*Pod{},
		containers:    map[string]container{},
		podContainers: map[string][]string{},
		denied:        make(chan error, 1),
		denialGrace:   cfg.DenialGrace,
	}
	if w.denialGrace <= 0 {
		w.denialGrace = DefaultDenialGrace
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			return pods.Watch(ctx, opts)
		},
	}
	w.informer = cache.NewSharedIndexInformerWithOptions(plainListWatch{lw}, &corev1.Pod{}, cache.SharedIndexInformerOptions{})
	if err := w.informer.SetTransform(trim); err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	if err := w.informer.SetWatchErrorHandlerWithContext(w.watchError); err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	var err error
	if w.handler, err = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.put(obj); w.changed() },
		UpdateFunc: func(old, obj any) { w.replace(old, obj); w.changed() },
		DeleteFunc: func(obj any) { w.delete(obj); w.changed() },
	}); err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	return w, nil
}

// plainListWatch makes the reflector list, then watch, rather than stream the list
// through a watch (WatchListClient): the same requests whatever the client, and a
// list of one node's pods is small.
type plainListWatch struct{ *cache.ListWatch }

func (plainListWatch) IsWatchListSemanticsUnSupported() bool { return true }

// Run watches until ctx ends and then returns nil. If the API server refuses the first
// list (no token, or RBAC forbids it) for DenialGrace, Run returns an error wrapping
// ErrNoAPIAccess; other failures, and all after the first list, are retried with
// backoff while the cache keeps what it has.
func (w *Watcher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.informer.RunWithContext(ctx)
	}()
	select {
	case <-ctx.Done():
		<-done
		return nil
	case err := <-w.denied:
		cancel()
		<-done
		return fmt.Errorf("kube: list pods on node %s: %w: %w", w.node, ErrNoAPIAccess, err)
	}
}

// Synced reports whether the first list has been applied: Lookup knows every pod
// listed then. (The informer's own HasSynced turns true before its handlers have run.)
func (w *Watcher) Synced() bool { return w.handler.HasSynced() }

// watchError hears of every failed list and watch (the reflector then backs off and
// tries again). Refusals before the first list has succeeded end Run once they have
// lasted denialGrace; one refusal alone does not.
func (w *Watcher) watchError(ctx context.Context, r *cache.Reflector, err error) {
	cache.DefaultWatchErrorHandler(ctx, r, err)
	if w.informer.HasSynced() || !(apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)) {
		return
	}
	// Only the reflector's goroutine calls this: firstDenial needs no lock.
	now := time.Now()
	if w.firstDenial.IsZero() {
		w.firstDenial = now
	}
	if now.Sub(w.firstDenial) < w.denialGrace {
		return
	}
	select {
	case w.denied <- err:
	default:
	}
}

// Lookup returns the pod with podUID (from a cgroup path; a static pod's config hash
// works too) and its container with containerID. Either may be "": with no podUID the
// pod is found through the container. ok is false when no such pod is known.
func (w *Watcher) Lookup(podUID, containerID string) (Pod, Container, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	c, known := w.containers[containerID]
	if podUID == "" {
		if !known {
			return Pod{}, Container{}, false
		}
		podUID = c.podUID
	}
	p, ok := w.pods[podUID]
	if !ok {
		return Pod{}, Container{}, false
	}
	ctr := Container{ID: containerID}
	if known && c.podUID == p.UID {
		ctr.Name = c.name
	}
	return *p, ctr, true
}

func (w *Watcher) put(obj any) {
	s, ok := obj.(*stored)
	// The field selector keeps other nodes' pods out; this keeps them out of the
	// cache should a server or proxy ignore it.
	if !ok || s.pod.NodeName != w.node {
		return
	}
	pod, cs := &s.pod, s.containers
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forget(pod.UID)
	w.pods[pod.UID] = pod
	if pod.mirrorHash != "" && pod.mirrorHash != pod.UID {
		w.pods[pod.mirrorHash] = pod
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		w.containers[c.ID] = container{podUID: pod.UID, name: c.Name}
		ids = append(ids, c.ID)
	}
	w.podContainers[pod.UID] = ids
}

// replace applies an update. The informer keys pods by namespace and name: a pod deleted
// and made again under its name (a StatefulSet's) while the watch was down comes back
// from the new list as an update of the old one, whose UID must be forgotten too.
func (w *Watcher) replace(old, obj any) {
	if o, ok := old.(*stored); ok {
		if n, ok := obj.(*stored); !ok || n.pod.UID != o.pod.UID {
			w.delete(old)
		}
	}
	w.put(obj)
}

func (w *Watcher) delete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*stored)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forget(s.pod.UID)
}

// forget removes a pod and its containers; w.mu is held.
func (w *Watcher) forget(uid string) {
	if old, ok := w.pods[uid]; ok && old.mirrorHash != "" && w.pods[old.mirrorHash] == old {
		delete(w.pods, old.mirrorHash)
	}
	delete(w.pods, uid)
	for _, id := range w.podContainers[uid] {
		if w.containers[id].podUID == uid {
			delete(w.containers, id)
		}
	}
	delete(w.podContainers, uid)
}

package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sonde-profiler/sonde/internal/retry"
)

// ErrNoAPIAccess says pod metadata cannot be had: sonde does not run in a cluster, or
// its service account may not list pods. Attributes are then the ids from cgroup paths
// only; the caller says so once.
var ErrNoAPIAccess = errors.New("no access to the Kubernetes API")

// Config configures a Watcher.
type Config struct {
	// NodeName is this node's name (the pod's spec.nodeName, from the downward API):
	// only pods scheduled here are listed and watched.
	NodeName string
	// API is how to reach the API server; nil means the in-cluster configuration (the
	// service account's token and CA, KUBERNETES_SERVICE_HOST and _PORT).
	API *APIConfig
	// DenialGrace is how long refusals of the first list (401, 403) are retried before
	// Run gives up with ErrNoAPIAccess; 0 means DefaultDenialGrace. An API server that
	// has just started refuses everyone until its RBAC caches have synced, and a new
	// ServiceAccount's binding may land after the DaemonSet's pods start: giving up on
	// the first refusal would leave sonde without metadata until it restarts.
	DenialGrace time.Duration
	// OnError, when set, hears of each failed list or watch; the watcher retries them.
	OnError func(error)
}

// DefaultDenialGrace is Config.DenialGrace's default.
const DefaultDenialGrace = 30 * time.Second

// Watcher keeps the metadata of this node's pods current: it lists them, then follows
// a watch from the list's resource version, and lists again when the server no longer
// has that version (410 Gone).
type Watcher struct {
	node     string
	selector string // the field selector of every request: this node's pods only
	client   *podClient
	onError  func(error)
	synced   atomic.Bool

	mu         sync.RWMutex
	pods       map[string]*Pod      // by pod UID, and by config hash for static pods
	byKey      map[string]*stored   // by namespace/name, as the API names pods
	containers map[string]container // by container id
	// podContainers lists each pod's container ids, to forget them with the pod.
	podContainers map[string][]string

	denialGrace time.Duration

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
	api := cfg.API
	if api == nil {
		var err error
		if api, err = InClusterConfig(); err != nil {
			return nil, fmt.Errorf("kube: %w: %w", ErrNoAPIAccess, err)
		}
	}
	client, err := newPodClient(api)
	if err != nil {
		return nil, fmt.Errorf("kube: %w", err)
	}
	w := &Watcher{
		node:          cfg.NodeName,
		selector:      "spec.nodeName=" + cfg.NodeName,
		client:        client,
		onError:       cfg.OnError,
		pods:          map[string]*Pod{},
		byKey:         map[string]*stored{},
		containers:    map[string]container{},
		podContainers: map[string][]string{},
		denialGrace:   cfg.DenialGrace,
	}
	if w.denialGrace <= 0 {
		w.denialGrace = DefaultDenialGrace
	}
	return w, nil
}

// Backoff between failed requests, as client-go's reflector spaces them: doubling from
// initialBackoff to maxBackoff, jittered.
const (
	initialBackoff = 800 * time.Millisecond
	maxBackoff     = 30 * time.Second
	// A watch that ends this soon, having delivered nothing, counts as failed: a server
	// or proxy that closes watches at once would otherwise be asked again in a loop.
	minWatch = time.Second
)

// backoff counts the failures since the last success.
type backoff struct{ attempt int }

func (b *backoff) next() time.Duration {
	d := retry.Backoff(initialBackoff, maxBackoff, b.attempt)
	b.attempt++
	return d
}

func (b *backoff) reset() { b.attempt = 0 }

// Run watches until ctx ends and then returns nil. If the API server refuses the first
// list (no token, or RBAC forbids it) for DenialGrace, Run returns an error wrapping
// ErrNoAPIAccess; other failures, and all after the first list, are retried with
// backoff while the watcher keeps what it has.
func (w *Watcher) Run(ctx context.Context) error {
	var bo backoff
	var firstDenial time.Time
	for {
		rv, err := w.list(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if isDenied(err) && !w.Synced() {
				now := time.Now()
				if firstDenial.IsZero() {
					firstDenial = now
				}
				if now.Sub(firstDenial) >= w.denialGrace {
					return fmt.Errorf("kube: list pods on node %s: %w: %w", w.node, ErrNoAPIAccess, err)
				}
			}
			w.report(fmt.Errorf("list pods: %w", err))
			if !retry.Sleep(ctx, bo.next()) {
				return nil
			}
			continue
		}
		bo.reset()
		for {
			err := w.watch(ctx, &rv, &bo)
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				continue // the server's timeout ended the watch: go on from rv
			}
			if isGone(err) {
				// Compacted away, as etcd does every few minutes: only a new list
				// brings the pods back. Expected, so not reported.
				break
			}
			w.report(fmt.Errorf("watch pods from resource version %s: %w", rv, err))
			if !retry.Sleep(ctx, bo.next()) {
				return nil
			}
			if statusCode(err) != 0 {
				// The server answered, and not with events: list again, as client-go's
				// reflector does. A connection that failed (the server restarting) is
				// tried again from rv.
				break
			}
		}
	}
}

func (w *Watcher) report(err error) {
	if w.onError != nil {
		w.onError(err)
	}
}

// list replaces what the watcher knows with this node's pods now and returns the list's
// resource version.
func (w *Watcher) list(ctx context.Context) (string, error) {
	l, err := w.client.List(ctx, w.selector)
	if err != nil {
		return "", err
	}
	keys := make(map[string]bool, len(l.Items))
	w.mu.Lock()
	for i := range l.Items {
		s := trim(&l.Items[i])
		keys[s.key] = true
		w.put(s)
	}
	for k, s := range w.byKey {
		if !keys[k] {
			w.forget(s.pod.UID)
			delete(w.byKey, k)
		}
	}
	w.mu.Unlock()
	w.synced.Store(true)
	w.changed()
	return l.Metadata.ResourceVersion, nil
}

// watch applies one watch's events from *rv on, advancing *rv as they come. It returns
// nil when the server ended the watch in the ordinary way.
func (w *Watcher) watch(ctx context.Context, rv *string, bo *backoff) error {
	started := time.Now()
	s, err := w.client.Watch(ctx, w.selector, *rv)
	if err != nil {
		return err
	}
	defer s.Close()
	events := 0
	for {
		e, err := s.Next()
		if errors.Is(err, io.EOF) {
			if events == 0 && time.Since(started) < minWatch {
				return errors.New("the server ended the watch at once")
			}
			return nil
		}
		if err != nil {
			return err
		}
		if e.Type == "ERROR" {
			var st status
			if err := json.Unmarshal(e.Object, &st); err != nil || st.Code == 0 {
				return fmt.Errorf("watch error event: %s", e.Object)
			}
			return &apiError{Code: st.Code, Reason: st.Reason, Message: st.Message}
		}
		var p apiPod
		if err := json.Unmarshal(e.Object, &p); err != nil {
			return fmt.Errorf("decode %s event: %w", e.Type, err)
		}
		switch e.Type {
		case "ADDED", "MODIFIED":
			w.mu.Lock()
			w.put(trim(&p))
			w.mu.Unlock()
			w.changed()
		case "DELETED":
			w.mu.Lock()
			if s, ok := w.byKey[p.key()]; ok && s.pod.UID == p.Metadata.UID {
				w.forget(s.pod.UID)
				delete(w.byKey, s.key)
			}
			w.mu.Unlock()
			w.changed()
		case "BOOKMARK":
		default:
			return fmt.Errorf("watch event of unknown type %q", e.Type)
		}
		if v := p.Metadata.ResourceVersion; v != "" {
			*rv = v
		}
		events++
		bo.reset()
	}
}

// Synced reports whether the first list has been applied: Lookup knows every pod
// listed then.
func (w *Watcher) Synced() bool { return w.synced.Load() }

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

// put stores a pod the API server sent; w.mu is held. A pod of the same name under
// another UID (deleted and made again, as a StatefulSet's pod is, while the watch was
// down) replaces the old one, whose UID and containers are forgotten.
func (w *Watcher) put(s *stored) {
	if old, ok := w.byKey[s.key]; ok && old.pod.UID != s.pod.UID {
		w.forget(old.pod.UID)
		delete(w.byKey, s.key)
	}
	// The field selector keeps other nodes' pods out; this keeps them out should a
	// server or proxy ignore it.
	if s.pod.NodeName != w.node {
		return
	}
	pod, cs := &s.pod, s.containers
	w.forget(pod.UID)
	w.byKey[s.key] = s
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

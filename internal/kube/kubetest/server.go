// Package kubetest is an API server for unit tests of sonde's pod watcher: it lists
// and watches pods over HTTP in JSON as kube-apiserver does (the spec.nodeName field
// selector, resource versions, bookmarks, an ERROR event with 410 for a version
// compacted away), from pods the test creates, updates and deletes. test/kube runs
// the watcher against a real kube-apiserver; this one runs in every `make test`.
package kubetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Server is a fake API server holding pods.
type Server struct {
	*httptest.Server

	mu        sync.Mutex
	rv        int64
	pods      map[string]*corev1.Pod // by namespace/name
	events    []event                // since compacted
	compacted int64                  // watches from before this version get 410
	wake      chan struct{}          // closed and replaced at each change
	closing   chan struct{}          // closed and replaced to end the watches open
	requests  []*url.URL
	refuse    func(r *http.Request) int
}

type event struct {
	rv  int64
	typ string
	pod corev1.Pod
}

// New starts a server holding pods; the test's cleanup stops it.
func New(t testing.TB, pods ...*corev1.Pod) *Server {
	s := &Server{pods: map[string]*corev1.Pod{}, wake: make(chan struct{}), closing: make(chan struct{})}
	for _, p := range pods {
		s.store("ADDED", p.DeepCopy())
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.CloseWatches()
		s.Server.Close()
	})
	return s
}

// Refuse makes the server answer requests with the status f returns instead, while it
// returns one other than 0.
func (s *Server) Refuse(f func(r *http.Request) int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = f
}

// Requests returns the requests served so far.
func (s *Server) Requests() []*url.URL {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

func key(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// store records a change; s.mu is held or the server not yet started.
func (s *Server) store(typ string, p *corev1.Pod) {
	s.rv++
	p.ResourceVersion = strconv.FormatInt(s.rv, 10)
	if typ == "DELETED" {
		delete(s.pods, key(p))
	} else {
		s.pods[key(p)] = p
	}
	s.events = append(s.events, event{s.rv, typ, *p.DeepCopy()})
	close(s.wake)
	s.wake = make(chan struct{})
}

// Create adds a pod, Update replaces it, Delete removes it; watches hear of each.
func (s *Server) Create(p *corev1.Pod) { s.change("ADDED", p.DeepCopy()) }
func (s *Server) Update(p *corev1.Pod) { s.change("MODIFIED", p.DeepCopy()) }
func (s *Server) Delete(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, ok := s.pods[namespace+"/"+name]; ok {
		s.store("DELETED", p.DeepCopy())
	}
}

func (s *Server) change(typ string, p *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store(typ, p)
}

// Compact forgets the events so far, as etcd's compaction does: a watch from an older
// version is told 410 Gone.
func (s *Server) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compacted = s.rv
	s.events = nil
}

// CloseWatches ends the watches open now, as the server's timeout does.
func (s *Server) CloseWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.closing)
	s.closing = make(chan struct{})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r.URL)
	refuse := s.refuse
	s.mu.Unlock()
	if refuse != nil {
		if code := refuse(r); code != 0 {
			writeStatus(w, code, "refused by the test")
			return
		}
	}
	if r.URL.Path != "/api/v1/pods" || r.Method != http.MethodGet {
		writeStatus(w, http.StatusNotFound, "no such resource")
		return
	}
	q := r.URL.Query()
	node, ok := strings.CutPrefix(q.Get("fieldSelector"), "spec.nodeName=")
	if !ok && q.Get("fieldSelector") != "" {
		writeStatus(w, http.StatusBadRequest, "field selector not supported")
		return
	}
	chosen := func(p *corev1.Pod) bool { return !ok || p.Spec.NodeName == node }
	w.Header().Set("Content-Type", "application/json")
	if q.Get("watch") != "true" {
		s.mu.Lock()
		list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatInt(s.rv, 10)}}
		for _, p := range s.pods {
			if chosen(p) {
				list.Items = append(list.Items, *p.DeepCopy())
			}
		}
		s.mu.Unlock()
		json.NewEncoder(w).Encode(list)
		return
	}
	from, err := strconv.ParseInt(q.Get("resourceVersion"), 10, 64)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "resourceVersion: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	enc := json.NewEncoder(w)
	s.mu.Lock()
	if from < s.compacted {
		s.mu.Unlock()
		enc.Encode(map[string]any{"type": "ERROR", "object": metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: http.StatusGone, Reason: metav1.StatusReasonExpired, Message: fmt.Sprintf("too old resource version: %d (%d)", from, s.compacted)}})
		return
	}
	closing := s.closing
	s.mu.Unlock()
	for {
		s.mu.Lock()
		var send []event
		for _, e := range s.events {
			if e.rv > from {
				send = append(send, e)
			}
		}
		wake := s.wake
		s.mu.Unlock()
		for _, e := range send {
			from = e.rv
			if !chosen(&e.pod) {
				continue
			}
			e.pod.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
			if err := enc.Encode(map[string]any{"type": e.typ, "object": e.pod}); err != nil {
				return
			}
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-closing:
			return
		case <-wake:
		}
	}
}

func writeStatus(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: metav1.StatusReason(http.StatusText(code)), Message: msg})
}

// Package kube tests sonde's Kubernetes side against a real kube-apiserver and etcd
// rather than client-go's fake clientset, which accepts what a real server refuses: a
// field selector the server does not index, a verb the ClusterRole does not grant, a
// watch that expires (410 Gone), a manifest validation or admission rejects.
//
// The harness builds both servers from Go modules (./server, a module of its own
// because k8s.io/kubernetes pins other client-go versions than sonde's), caches the
// binaries under the user's cache directory keyed by that module's content, and starts
// them on 127.0.0.1 with generated certificates, a service-account signing key, Node and
// RBAC authorization, an admin token and an audit log of pod reads. Tests get a client
// config; sonde's watcher runs as the ServiceAccount deploy/kubernetes creates, with a
// token the API server issues, so RBAC is the real ClusterRole's.
package kube

// Package kube names the pods and containers on this node: it watches the API server
// for this node's pods only and keeps, per pod UID and container id, the few fields
// that become resource attributes (names, namespace, owning workload, two labels).
package kube

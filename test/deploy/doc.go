// Package deploy tests what deploy/ ships: the Helm chart and the manifests decode
// strictly as Kubernetes objects and carry the security settings sonde is meant to run
// with, the systemd unit verifies, the image holds the binary `make build` makes, and
// sonde works under the capability set those files grant.
package deploy

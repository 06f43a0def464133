// Command kube-apiserver is Kubernetes' API server, built from k8s.io/kubernetes for the
// tests of sonde's Kubernetes metadata (see ../../doc.go).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }

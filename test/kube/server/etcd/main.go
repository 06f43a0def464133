// Command etcd is etcd's server, built from go.etcd.io/etcd/server/v3 for the tests of
// sonde's Kubernetes metadata (see ../../doc.go).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

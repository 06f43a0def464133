// Command servers builds the etcd and kube-apiserver the Kubernetes tests start, into the
// cache they look in (see kube.Binaries), and prints their paths. CI runs it in the
// background while the other tests run, so that make test-kube finds them built.
package main

import (
	"fmt"
	"os"

	"github.com/sonde-profiler/sonde/test/kube"
)

func main() {
	etcd, apiserver, err := kube.Binaries()
	if err != nil {
		fmt.Fprintln(os.Stderr, "servers:", err)
		os.Exit(1)
	}
	fmt.Println(etcd)
	fmt.Println(apiserver)
}

// Command mkimage writes sonde's OCI image without a container engine: one layer with
// the static binary at /usr/bin/sonde, as an OCI image layout directory and, optionally,
// a tarball that `docker load` and `podman load` read. The same binary and epoch give
// the same image digest.
//
// It is its own module so that the image library's dependencies stay out of the
// agent's go.mod.
package main

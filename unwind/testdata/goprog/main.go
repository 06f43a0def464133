// Command goprog gives the unwind tests a Go binary: the Go linker writes only
// .debug_frame (CIE version 3, data alignment -4, compressed), no .eh_frame.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Println(len(os.Args))
}

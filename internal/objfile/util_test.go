package objfile

import (
	"strconv"
	"unsafe"
)

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
func itoa(n int) string                     { return strconv.Itoa(n) }

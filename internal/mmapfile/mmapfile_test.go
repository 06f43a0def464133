package mmapfile

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// sink keeps reads of mapped memory from being optimised away.
var sink byte

func writeFile(t *testing.T, size int) *os.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestMapReads(t *testing.T) {
	page := os.Getpagesize()
	f := writeFile(t, 3*page+5)
	r, err := Map(f)
	if err != nil {
		t.Fatal(err)
	}
	f.Close() // the mapping outlives the descriptor
	b := r.Bytes()
	if len(b) != 3*page+5 || r.Size() != int64(len(b)) {
		t.Fatalf("mapped %d bytes, size %d", len(b), r.Size())
	}
	if err := Guard(func() { sink = b[page+7] }); err != nil || sink != byte(page+7) {
		t.Fatalf("read %d, %v", sink, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if r.Bytes() != nil || r.Close() != nil {
		t.Error("a closed region still has bytes, or closing it twice failed")
	}
}

func TestMapEmpty(t *testing.T) {
	r, err := Map(writeFile(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Bytes()) != 0 || r.Close() != nil {
		t.Error("an empty file maps to bytes")
	}
}

// A file truncated under its mapping raises SIGBUS on the pages past its new end:
// under Guard that is an error, and the process lives on.
func TestTruncatedWhileMapped(t *testing.T) {
	page := os.Getpagesize()
	f := writeFile(t, 4*page)
	r, err := Map(f)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b := r.Bytes()
	// Resident before the truncation: the kernel must take the pages back.
	if err := Guard(func() { sink = b[3*page] }); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f.Name(), int64(page)); err != nil {
		t.Fatal(err)
	}
	if err := Guard(func() { sink = b[10] }); err != nil {
		t.Errorf("the page still in the file: %v", err)
	}
	err = Guard(func() { sink = b[3*page] })
	var fe *FaultError
	if !errors.As(err, &fe) || !errors.Is(err, ErrFault) {
		t.Fatalf("reading past the new end: %v, want a FaultError", err)
	}
	if base := uintptr(unsafe.Pointer(&b[0])); fe.Addr < base || fe.Addr >= base+uintptr(len(b)) {
		t.Errorf("fault at %#x, outside the mapping at %#x", fe.Addr, base)
	}
	// Faults stay errors after one was recovered, and copies fault alike.
	dst := make([]byte, 2*page)
	if err := Guard(func() { copy(dst, b[2*page:]) }); !errors.Is(err, ErrFault) {
		t.Errorf("copying past the end: %v", err)
	}
}

// Guard converts faults only: other panics, a nil dereference among them, go on.
func TestGuardPassesOtherPanics(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"value", func() { panic("boom") }},
		{"nil", func() {
			var p *int
			sink = byte(*p)
		}},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Guard swallowed the panic", tc.name)
				}
			}()
			_ = Guard(tc.fn)
		}()
	}
}

// rssOf returns the resident kilobytes of the mapping starting at addr, from smaps.
func rssOf(t *testing.T, addr uintptr) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("smaps: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	start := fmt.Sprintf("%x-", addr)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "-") && !strings.Contains(line, ":") || strings.HasPrefix(line, start) {
			in = strings.HasPrefix(line, start)
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			kb, err := strconv.Atoi(strings.Fields(line)[1])
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatalf("no mapping at %#x in smaps", addr)
	return 0
}

// Only what is read becomes resident, and Release gives it back.
func TestResidency(t *testing.T) {
	const size = 16 << 20
	r, err := Map(writeFile(t, size))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b := r.Bytes()
	addr := uintptr(unsafe.Pointer(&b[0]))
	if kb := rssOf(t, addr); kb != 0 {
		t.Fatalf("%d KiB resident before any read", kb)
	}
	if err := Guard(func() { sink = b[size/2] }); err != nil {
		t.Fatal(err)
	}
	// The kernel maps the cached pages around a fault: 64 KiB, or the large folio
	// (up to 2 MiB) a freshly written file sits in.
	if kb := rssOf(t, addr); kb == 0 || kb > size>>10/4 {
		t.Errorf("%d KiB resident after reading one byte", kb)
	}
	if err := Guard(func() {
		for i := 0; i < size; i += 4096 {
			sink += b[i]
		}
	}); err != nil {
		t.Fatal(err)
	}
	if kb := rssOf(t, addr); kb < size>>10*9/10 {
		t.Errorf("%d KiB resident after reading all %d KiB", kb, size>>10)
	}
	r.Release(b[1:]) // the first page is only partly inside: it stays
	if kb := rssOf(t, addr); kb > 8 {
		t.Errorf("%d KiB resident after Release", kb)
	}
}

// Anonymous scratch memory is writable, resident only where written, and gone at
// Close.
func TestAnon(t *testing.T) {
	const size = 8 << 20
	r, err := Anon(size)
	if err != nil {
		t.Fatal(err)
	}
	b := r.Bytes()
	addr := uintptr(unsafe.Pointer(&b[0]))
	if kb := rssOf(t, addr); kb != 0 {
		t.Fatalf("%d KiB resident before any write", kb)
	}
	copy(b[size/2:], "scratch")
	if string(b[size/2:size/2+7]) != "scratch" {
		t.Fatal("anonymous memory lost a write")
	}
	if kb := rssOf(t, addr); kb == 0 || kb > 2048 {
		t.Errorf("%d KiB resident after writing one page", kb)
	}
	if err := r.Close(); err != nil || r.Bytes() != nil {
		t.Fatalf("Close: %v", err)
	}
	if r, err := Anon(0); err != nil || len(r.Bytes()) != 0 {
		t.Errorf("Anon(0) = %v, %v", r, err)
	}
}

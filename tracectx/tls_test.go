package tracectx

import (
	"debug/elf"
	"path/filepath"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testprog"
)

func openELF(t *testing.T, path string) *elf.File {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Each way of building the OTEP's variable is told apart by its relocations, and only the
// module that defines it is found.
func TestFindTLSAccessModels(t *testing.T) {
	for variant, want := range map[string]TLSAccess{"exe": LocalExec, "tlsdesc": TLSDesc, "gd": GlobalDynamic} {
		t.Run(variant, func(t *testing.T) {
			bin := testprog.BuildThreadContext(t, variant)
			definer := bin
			if variant != "exe" {
				definer = filepath.Join(filepath.Dir(bin), "libotelctx.so")
				if sym, err := FindTLS(openELF(t, bin)); err != nil || sym != nil {
					t.Errorf("the executable, which only uses the library's variable: %+v, %v", sym, err)
				}
			}
			sym, err := FindTLS(openELF(t, definer))
			if err != nil || sym == nil {
				t.Fatalf("FindTLS: %+v, %v", sym, err)
			}
			if sym.Access != want {
				t.Errorf("access %v, want %v", sym.Access, want)
			}
			if want == LocalExec && (sym.Offset >= 0 || sym.Offset < -4096) {
				t.Errorf("local-exec offset %d: want just below the thread pointer", sym.Offset)
			}
			if want != LocalExec && sym.GOT == 0 {
				t.Errorf("no GOT slot: %+v", sym)
			}
			t.Logf("%s: %+v", variant, sym)
		})
	}
}

func TestFindTLSAbsent(t *testing.T) {
	sym, err := FindTLS(openELF(t, "/proc/self/exe"))
	if err != nil || sym != nil {
		t.Errorf("a Go test binary: %+v, %v", sym, err)
	}
}

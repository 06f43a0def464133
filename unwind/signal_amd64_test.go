//go:build amd64

package unwind

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// TestSignalFrameOffsets ties unwind's ucontext offsets (which the kernel walker and the
// model both use) to glibc's headers and to the CFI glibc itself gives __restore_rt: the
// registers the walker reads from a signal frame,
// and every general-purpose register a dereferencing rule may name.
func TestSignalFrameOffsets(t *testing.T) {
	want := map[string]int{"rip": SignalPCOffset, "rsp": SignalSPOffset, "rbp": SignalFPOffset}
	for i, name := range dwarfRegNames {
		want[name] = int(UContextOffset[i])
	}
	t.Run("headers", func(t *testing.T) {
		gcc := testenv.RequireTool(t, "gcc")
		dir := t.TempDir()
		src := filepath.Join(dir, "uc.c")
		const prog = `#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <ucontext.h>
int main(void) {
#define R(name, reg) printf(#name " %zu\n", offsetof(ucontext_t, uc_mcontext.gregs[reg]))
	R(rip, REG_RIP); R(rsp, REG_RSP); R(rbp, REG_RBP); R(rax, REG_RAX); R(rdx, REG_RDX); R(rcx, REG_RCX);
	R(rbx, REG_RBX); R(rsi, REG_RSI); R(rdi, REG_RDI); R(r8, REG_R8); R(r9, REG_R9); R(r10, REG_R10);
	R(r11, REG_R11); R(r12, REG_R12); R(r13, REG_R13); R(r14, REG_R14); R(r15, REG_R15);
	return 0;
}
`
		if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "uc")
		if out, err := exec.Command(gcc, "-o", bin, src).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatal(err)
		}
		checkOffsets(t, string(out), regexp.MustCompile(`(?m)^(r[a-z0-9]+) ([0-9]+)$`), want)
	})
	t.Run("libc", func(t *testing.T) {
		readelf := testenv.RequireTool(t, "readelf")
		requireFile(t, libcPath)
		out, _ := exec.Command(readelf, "-W", "--debug-dump=frames", libcPath).Output()
		// The signal frame's CIE is the one with 'S'; its FDE gives each register as
		// DW_CFA_expression: rN (name) (DW_OP_breg7 (rsp): offset).
		_, sig, ok := strings.Cut(string(out), `Augmentation:          "zRS"`)
		if !ok {
			t.Fatal("no signal frame CIE in libc")
		}
		fde, _, _ := strings.Cut(sig[strings.Index(sig, "FDE"):], "\n\n")
		checkOffsets(t, fde, regexp.MustCompile(`DW_CFA_expression: r[0-9]+ \((r[a-z0-9]+)\) \(DW_OP_breg7 \(rsp\): ([0-9]+)\)`), want)
	})
}

// dwarfRegNames are the general-purpose registers by DWARF number.
var dwarfRegNames = [NumGPR]string{"rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"}

func checkOffsets(t *testing.T, text string, re *regexp.Regexp, want map[string]int) {
	t.Helper()
	got := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		got[m[1]] = m[2]
	}
	for reg, off := range want {
		if got[reg] != strconv.Itoa(off) {
			t.Errorf("%s at %q, Step uses %d", reg, got[reg], off)
		}
	}
}

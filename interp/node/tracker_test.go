package node

import (
	"debug/elf"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/interp/interptest"
	"github.com/sonde-profiler/sonde/trace"
)

// TestInspectNode reads the system's node: its metadata says what the kernel walker and
// the namer assume of the frame layout, and its builtins are found.
func TestInspectNode(t *testing.T) {
	node, err := filepath.EvalSymlinks(testenv.Nodes(t)[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	e := openELF(t, node)
	v := inspectELF(t, e)
	m := v.Meta
	if m.FPContext != -8 || m.FPFunction != -16 || m.SmiShift != 32 || m.InstructionStart != 16 {
		t.Errorf("metadata %+v", m)
	}
	if v.Builtins[0] == 0 || v.Builtins[1] <= v.Builtins[0] {
		t.Errorf("builtins %#x", v.Builtins)
	}
	checkInterpreter(t, e, v)
	got := BuiltinsCode(e)
	if len(got) != 2 || got[0] != v.Builtins {
		t.Fatalf("frame-pointer code %#x, want the builtins %#x and the stack scan's trampoline", got, v.Builtins)
	}
	// The trampoline: push rbp, mov rbp, rsp, the registers, its call and return.
	if tr := got[1]; tr[0] == 0 || tr[1]-tr[0] < 8 || tr[1]-tr[0] > 64 || (tr[0] < v.Builtins[1] && tr[1] > v.Builtins[0]) {
		t.Errorf("the stack scan's trampoline at %#x, the builtins at %#x", tr, v.Builtins)
	}
	// A file without V8.
	sh, _ := filepath.EvalSymlinks("/bin/sh")
	se, err := elf.Open(sh)
	if err != nil {
		t.Fatal(err)
	}
	defer se.Close()
	if _, err := Inspect(se); !errors.Is(err, ErrNotV8) {
		t.Errorf("/bin/sh: %v, want ErrNotV8", err)
	}
	if got := BuiltinsCode(se); got != nil {
		t.Errorf("/bin/sh: frame-pointer code %#x", got)
	}
}

// TestTracker: V8 is found among a process's mappings, its builtins placed at the load
// bias and again where V8 remapped them, its code range taken from the process's maps;
// a process gone is deleted from the kernel.
func TestTracker(t *testing.T) {
	path, err := filepath.EvalSymlinks(testenv.Nodes(t)[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	f := interptest.HostFile(t, path)
	v := inspectELF(t, openELF(t, path))
	off, ok := v.fileOffset(v.Builtins[0])
	if !ok {
		t.Fatal("builtins outside the file")
	}
	var text elf.ProgHeader
	for _, p := range v.loads {
		if p.Flags&elf.PF_X != 0 {
			text = p
		}
	}
	k := interptest.NewKernel[KernelState]()
	maps := "7f10f8000000-7f10f8003000 rw-p 00000000 00:00 0 \n7f10f8003000-7f10f803f000 rwxp 00000000 00:00 0 \n7f10f803f000-7f1117e40000 ---p 00000000 00:00 0 \n"
	tr := NewTracker(TrackerConfig{Kernel: k, Maps: func(uint32) []byte { return []byte(maps) }})
	const remap = 0x7f1117e40000
	tr.ProcessMappings(42, 7, []*trace.Mapping{
		{Start: text.Vaddr, End: text.Vaddr + text.Filesz, Offset: text.Off, Path: path, File: f},
		{Start: 0x7f10f8003000, End: 0x7f10f803f000},
		{Start: remap, End: remap + (v.Builtins[1] - v.Builtins[0]), Offset: off, Path: path, File: interptest.HostFile(t, path)},
	})
	st, ok := k.States[42]
	if !ok {
		t.Fatal("no V8 state for the process")
	}
	if st.ExecID != 7 || [2]uint64{st.BuiltinsStart, st.BuiltinsEnd} != v.Builtins || [2]uint64{st.JitStart, st.JitEnd} != [2]uint64{0x7f10f8000000, 0x7f1117e40000} ||
		[2]uint64{st.RemapStart, st.RemapEnd} != [2]uint64{remap, remap + v.Builtins[1] - v.Builtins[0]} {
		t.Errorf("state %+v", st)
	}
	if st.OffFpFunction != -16 || st.FunctionShared == 0 || st.TypeEntry == 0 {
		t.Errorf("frame layout %+v", st)
	}
	self, _ := os.Executable()
	tr.ProcessMappings(43, 1, []*trace.Mapping{{Start: 0x1000, End: 0x2000, Path: self, File: interptest.HostFile(t, self)}})
	if _, ok := k.States[43]; ok {
		t.Error("a process without V8 was told to the kernel")
	}
	tr.ProcessGone(42)
	if len(k.Deleted) != 1 || k.Deleted[0] != 42 || tr.Image(42) != nil {
		t.Errorf("deleted %v", k.Deleted)
	}
	if s := tr.Stats(); s.V8s != 1 || s.Processes != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestInspectNode22: Node 22's metadata (V8 12.4) names its fields with other types and
// leaves out SharedFunctionInfo's function data and Code's deoptimization data and source
// positions: its functions are named, those slots told by type; a copy whose metadata
// lacks a field naming reads is walked and named [v8].
func TestInspectNode22(t *testing.T) {
	path, err := filepath.EvalSymlinks(testenv.Node22(t).Path)
	if err != nil {
		t.Fatal(err)
	}
	e := openELF(t, path)
	v := inspectELF(t, e)
	checkInterpreter(t, e, v)
	m := v.Meta
	if v.Unnamed != nil || m.SFINameOrScopeInfo == 0 || m.SFIScript == 0 || m.SFIFunction != 0 || m.CodeDeoptData != 0 ||
		m.CodeNamedFrom <= 8 || m.BytecodePositions != 0 || m.BytecodeNamedTo == 0 || m.TypeTrustedByteArray < 0 {
		t.Errorf("Node 22: unnamed %v, metadata %+v", v.Unnamed, m)
	}
	v = inspectELF(t, openELF(t, testenv.NodeWithoutNaming(t).Path))
	if !errors.Is(v.Unnamed, ErrNoMetadata) || !strings.Contains(v.Unnamed.Error(), "v8 12.4.") || v.Meta.FPFunction != -16 || v.Meta.FunctionShared == 0 {
		t.Errorf("without naming metadata: unnamed %v, metadata %+v", v.Unnamed, v.Meta)
	}
}

// TestInspectNode24: Node 24's metadata (V8 13.6) keeps a wrapper of the function in a
// Code's deoptimization data and no longer names JSFunction's code (leaptiering); its
// functions are named through the wrapper.
func TestInspectNode24(t *testing.T) {
	path, err := filepath.EvalSymlinks(testenv.NPMNode(t, 24).Path)
	if err != nil {
		t.Fatal(err)
	}
	e := openELF(t, path)
	v := inspectELF(t, e)
	checkInterpreter(t, e, v)
	m := v.Meta
	if !strings.HasPrefix(v.Version, "13.6.") {
		t.Errorf("Node 24's V8 %q, want 13.6", v.Version)
	}
	if v.Unnamed != nil || m.SFIWrapperShared == 0 || m.TypeSFIWrapper < 0 || m.DeoptSFI == 0 ||
		m.ScopeInfoFirstVars != m.ScopeInfoContextLocals+3 {
		t.Errorf("Node 24: unnamed %v, metadata %+v", v.Unnamed, m)
	}
}

// checkInterpreter checks the interpreter's code found among the builtins: the entry
// trampolines, and the bytecode handlers from the first (Wide) to the last (Abort's
// ExtraWide), with Ldar's between and no other builtin.
func checkInterpreter(t *testing.T, e *elf.File, v *V8) {
	t.Helper()
	at := func(name string) uint64 {
		s, ok, err := objfile.FindSymbol(e, elf.SHT_SYMTAB, name, true)
		if !ok || err != nil {
			t.Fatalf("%s: %v, %v", name, ok, err)
		}
		return s.Value
	}
	in := v.Interpreter
	for _, c := range []struct {
		span [2]uint64
		name string
		at   uint64
	}{
		{in.Entry, "entry", at("Builtins_InterpreterEntryTrampoline")},
		{in.Entry, "entry", at("Builtins_InterpreterEntryTrampolineForProfiling")},
		{in.Handlers, "handlers", at("Builtins_WideHandler")},
		{in.Handlers, "handlers", at("Builtins_LdarHandler")},
		{in.Handlers, "handlers", at("Builtins_AbortExtraWideHandler")},
	} {
		if c.at < c.span[0] || c.at >= c.span[1] || c.span[0] < v.Builtins[0] || c.span[1] > v.Builtins[1] {
			t.Errorf("the interpreter's %s %#x, the builtins %#x: %#x outside", c.name, c.span, v.Builtins, c.at)
		}
	}
	// Builtins on either side of the handlers.
	for _, name := range []string{"Builtins_InterpreterPushArgsThenCall", "Builtins_ArrayPrototypePush", "Builtins_JSEntry"} {
		if a := at(name); a >= in.Handlers[0] && a < in.Handlers[1] || a >= in.Entry[0] && a < in.Entry[1] {
			t.Errorf("%s at %#x, within the interpreter's code %#x", name, a, in)
		}
	}
}

// openELF opens the ELF file at path for the test's length.
func openELF(t *testing.T, path string) *elf.File {
	t.Helper()
	e, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// inspectELF inspects the V8 of an ELF file.
func inspectELF(t *testing.T, e *elf.File) *V8 {
	t.Helper()
	v, err := Inspect(e)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestBuiltinsInterpreter: the interpreter's code is found as the run of bytecode handlers
// around Ldar's, which other builtins bound, beside the entry trampolines; a file with
// more Builtins_* symbols than any V8 has still gets its builtins' span, without an
// interpreter.
func TestBuiltinsInterpreter(t *testing.T) {
	gcc := testenv.RequireTool(t, "gcc")
	build := func(names []string) *elf.File {
		t.Helper()
		var asm strings.Builder
		asm.WriteString(".text\n.fill 64,1,0xcc\n") // no symbol at 0, which means none
		for _, n := range names {
			fmt.Fprintf(&asm, ".globl %[1]s\n.type %[1]s,@function\n%[1]s:\n.fill 64,1,0xcc\n.size %[1]s,64\n", n)
		}
		dir := t.TempDir()
		src, obj := filepath.Join(dir, "b.s"), filepath.Join(dir, "b.o")
		if err := os.WriteFile(src, []byte(asm.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(gcc, "-c", "-o", obj, src).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		return openELF(t, obj)
	}
	names := []string{"Builtins_JSEntry", "Builtins_InterpreterEntryTrampoline", "Builtins_InterpreterEntryTrampolineForProfiling",
		"Builtins_InterpreterPushArgsThenCall", "Builtins_WideHandler", "Builtins_LdarHandler", "Builtins_StarHandler",
		"Builtins_ArrayPrototypePush", "Builtins_ElsewhereHandler"}
	b, err := builtins(build(names))
	if err != nil {
		t.Fatal(err)
	}
	// Each symbol 64 bytes, from 64 in the object's .text: the handlers are the fifth to
	// the seventh, the trampolines the second and third.
	if b.span != [2]uint64{64, 64 * 10} || b.entry != [2]uint64{64 * 2, 64 * 4} || b.handlers != [2]uint64{64 * 5, 64 * 8} {
		t.Errorf("span %#x, entry %#x, handlers %#x", b.span, b.entry, b.handlers)
	}
	var many []string
	for i := range maxBuiltins + 1 {
		many = append(many, fmt.Sprintf("Builtins_B%d", i))
	}
	b, err = builtins(build(append(many, names...)))
	if err != nil {
		t.Fatal(err)
	}
	if b.span != [2]uint64{64, 64 * uint64(1+len(many)+len(names))} || b.entry != [2]uint64{} || b.handlers != [2]uint64{} {
		t.Errorf("%d builtins: span %#x, entry %#x, handlers %#x", len(many)+len(names), b.span, b.entry, b.handlers)
	}
}

// TestMetadataFilled reads each Node's v8dbg_* set and says which fields of the metadata
// it lacks and how sonde finds them instead, by V8's major version: a Node whose V8 drops
// another field, or names one sonde fills, fails here before its frames go unnamed.
func TestMetadataFilled(t *testing.T) {
	// What each V8 line lacks, and how it is filled (V8.Filled).
	want := map[string]map[string]string{
		"11": {"BytecodePositions": fillDefault},
		"12": {"BytecodePositions": fillSlotsByType, "CodeDeoptData": fillSlotsByType, "CodePositions": fillSlotsByType, "SFIFunction": fillSlotsByType},
		"13": {"BytecodePositions": fillSlotsByType, "CodeDeoptData": fillSlotsByType, "CodePositions": fillSlotsByType, "SFIFunction": fillSlotsByType},
	}
	for _, node := range testenv.Nodes(t) {
		t.Run(node.Name, func(t *testing.T) {
			path, err := filepath.EvalSymlinks(node.Path)
			if err != nil {
				t.Fatal(err)
			}
			v := inspectELF(t, openELF(t, path))
			if v.Unnamed != nil {
				t.Fatalf("v8 %s: %v", v.Version, v.Unnamed)
			}
			major, _, _ := strings.Cut(v.Version, ".")
			t.Logf("v8 %s: the metadata lacks %v", v.Version, v.Filled)
			w, ok := want[major]
			if !ok {
				t.Fatalf("v8 %s: no expectation for V8 %s", v.Version, major)
			}
			if !maps.Equal(v.Filled, w) {
				t.Errorf("v8 %s: fields filled %v, want %v", v.Version, v.Filled, w)
			}
		})
	}
}

package php

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

// TestInspect inspects Debian 12's php CLI, php-fpm and libphp (the embed SAPI's library,
// as Apache's module and embedding servers load the engine), and Debian sid's php CLI:
// each is found with the version it reports itself and its version's layout, which its own
// code confirms (the current frame's slot in executor_globals, an op array's file), with
// execute_ex's out-of-line part and the frame its body (and the JIT's code) runs on.
func TestInspect(t *testing.T) {
	host := testenv.HostPHP(t)
	files := map[string]string{host.File(): host.Version, testenv.HostPHPFPM(t): host.Version, testenv.HostLibPHP(t): host.Version}
	sid := testenv.DebianPHP(t)
	files[sid.File()] = sid.Version
	for path, version := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			e, err := Inspect(f)
			if err != nil {
				t.Fatal(err)
			}
			if e.Version.String() != version {
				t.Errorf("version %s, the program says %s", e.Version, version)
			}
			want, _ := tableLayout(e.Version)
			if e.Layout != want || e.Layout.CurrentExecuteData <= 0 {
				t.Errorf("layout %+v, want the table's %+v", e.Layout, want)
			}
			if e.Exec[0] == 0 || e.Exec[1] <= e.Exec[0] || e.ExecCold[1] <= e.ExecCold[0] {
				t.Errorf("execute_ex at %#x, its out-of-line part at %#x", e.Exec, e.ExecCold)
			}
			if e.Frame.CFA <= 0 || e.Frame.CFA%8 != 0 {
				t.Errorf("execute_ex's frame %+v", e.Frame)
			}
			t.Logf("php %s: execute_ex %#x, cold %#x, frame %+v", e.Version, e.Exec, e.ExecCold, e.Frame)
		})
	}
}

// TestLayoutMatchesHeaders compiles the engine's own headers (Debian's php8.2-dev, which CI
// installs) and holds the table's 8.2 layout to what the compiler lays out.
func TestLayoutMatchesHeaders(t *testing.T) {
	config, err := exec.LookPath("php-config8.2")
	if err != nil {
		testenv.Unavailable(t, "no php-config8.2 (apt-get install php8.2-dev)")
	}
	includes, err := exec.Command(config, "--includes").Output()
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{
		"CurrentExecuteData": "offsetof(zend_executor_globals, current_execute_data)",
		"ExOpline":           "offsetof(zend_execute_data, opline)",
		"ExFunc":             "offsetof(zend_execute_data, func)",
		"ExCallInfo":         "offsetof(zend_execute_data, This.u1.type_info)",
		"ExPrev":             "offsetof(zend_execute_data, prev_execute_data)",
		"FuncType":           "offsetof(zend_function, type)",
		"FuncFlags":          "offsetof(zend_function, common.fn_flags)",
		"FuncName":           "offsetof(zend_function, common.function_name)",
		"FuncScope":          "offsetof(zend_function, common.scope)",
		"OpArrayFilename":    "offsetof(zend_op_array, filename)",
		"OpArrayLineStart":   "offsetof(zend_op_array, line_start)",
		"OpLineno":           "offsetof(zend_op, lineno)",
		"ClassName":          "offsetof(zend_class_entry, name)",
		"StrTypeInfo":        "offsetof(zend_string, gc.u.type_info)",
		"StrLen":             "offsetof(zend_string, len)",
		"StrVal":             "offsetof(zend_string, val)",
		"lineEnd":            "offsetof(zend_op_array, line_end)",
		"callTop":            "ZEND_CALL_TOP",
		"internalFunction":   "ZEND_INTERNAL_FUNCTION",
		"stringType":         "IS_STRING",
	}
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"php.h\"\n#include \"zend_globals.h\"\nint main(void) {\n")
	for name, expr := range fields {
		fmt.Fprintf(&src, "\tprintf(\"%s %%zu\\n\", (size_t)(%s));\n", name, expr)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "layout.c"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(strings.Fields(string(includes)), "-D_GNU_SOURCE", "-w", "-o", filepath.Join(dir, "layout"), filepath.Join(dir, "layout.c"))
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(dir, "layout")).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, v, _ := strings.Cut(line, " ")
		got[name], _ = strconv.Atoi(v)
	}
	l := layouts[2]
	want := map[string]int{
		"CurrentExecuteData": l.CurrentExecuteData, "ExOpline": l.ExOpline, "ExFunc": l.ExFunc, "ExCallInfo": l.ExCallInfo,
		"ExPrev": l.ExPrev, "FuncType": l.FuncType, "FuncFlags": l.FuncFlags, "FuncName": l.FuncName, "FuncScope": l.FuncScope,
		"OpArrayFilename": l.OpArrayFilename, "OpArrayLineStart": l.OpArrayLineStart, "OpLineno": l.OpLineno,
		"ClassName": l.ClassName, "StrTypeInfo": l.StrTypeInfo, "StrLen": l.StrLen, "StrVal": l.StrVal,
		"lineEnd": l.OpArrayLineStart + 4, "callTop": callTop, "internalFunction": internalFunction, "stringType": stringType,
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: the headers say %d, sonde %d", name, got[name], w)
		}
	}
}

// TestVersionIn reads the release and build from what an engine keeps in .rodata.
func TestVersionIn(t *testing.T) {
	for _, c := range []struct {
		rodata     string
		want       Version
		threadSafe bool
		err        error
	}{
		{"\x00API20220829,NTS\x00X-Powered-By: PHP/8.2.36\x00", Version{8, 2, 36}, false, nil},
		{"\x00API20240924,TS\x00X-Powered-By: PHP/8.4.1\x00", Version{8, 4, 1}, true, nil},
		{"\x00API20230831,NTS\x00", Version{8, 3, 0}, false, nil},
		{"\x00API20990101,NTS\x00", Version{}, false, ErrUnsupported},
	} {
		v, ts, err := versionIn([]byte(c.rodata))
		if v != c.want || ts != c.threadSafe || !errors.Is(err, c.err) {
			t.Errorf("%q: %v ts=%v %v, want %v ts=%v %v", c.rodata, v, ts, err, c.want, c.threadSafe, c.err)
		}
	}
	if _, _, err := versionIn([]byte("\x00API20220829,NTS\x00X-Powered-By: PHP/8.4.1\x00")); err == nil {
		t.Error("an 8.4 release with 8.2's API number is read without error")
	}
	if _, _, err := versionIn([]byte("no php here")); err == nil {
		t.Error("a file without an API number is read without error")
	}
}

// TestLayoutFromCode reads the two offsets that move between releases from code as gcc
// compiles the functions that read them: Debian 12's 8.2, and the RIP-relative form of a
// build without -fPIC.
func TestLayoutFromCode(t *testing.T) {
	const fn, globals = 0x2f2b70, 0x58ae60
	isExecuting := []byte{
		0x48, 0x8d, 0x05, 0xe9, 0x82, 0x29, 0x00, // lea executor_globals(%rip), %rax
		0x48, 0x83, 0xb8, 0xe8, 0x01, 0x00, 0x00, 0x00, // cmpq $0, 0x1e8(%rax)
		0x0f, 0x95, 0xc0, // setne %al
		0xc3, // ret
	}
	if off, ok := globalsOffset(isExecuting, fn, globals); !ok || off != 488 {
		t.Errorf("zend_is_executing of 8.2: %d %v, want 488", off, ok)
	}
	// cmpq $0, executor_globals+0x1e8(%rip): the displacement from the next instruction.
	next := uint64(fn + 12)
	disp := uint32(globals + 0x1e8 - next)
	direct := []byte{0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x83, 0x3d, byte(disp), byte(disp >> 8), byte(disp >> 16), byte(disp >> 24), 0x00, 0x0f, 0x95, 0xc0, 0xc3}
	if off, ok := globalsOffset(direct, fn, globals); !ok || off != 488 {
		t.Errorf("RIP-relative behind endbr64: %d %v, want 488", off, ok)
	}
	if _, ok := globalsOffset([]byte{0x31, 0xc0, 0xc3}, fn, globals); ok {
		t.Error("found an offset in code that reads no global")
	}
	filename := []byte{
		0x48, 0x8b, 0x50, 0x18, // mov 0x18(%rax), %rdx: the frame's func
		0xc3,                         // ret
		0x48, 0x8b, 0x40, 0x30, 0xc3, // mov 0x30(%rax), %rax; ret: prev_execute_data, not a field of the function
		0x48, 0x8b, 0x82, 0x98, 0x00, 0x00, 0x00, // mov 0x98(%rdx), %rax
		0xc3, // ret
	}
	if off, ok := returnedField(filename, 0x2f2a10, 24, 48); !ok || off != 152 {
		t.Errorf("zend_get_executed_filename_ex of 8.2: %d %v, want 152", off, ok)
	}
}

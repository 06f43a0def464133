package python

import (
	"bufio"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/internal/testenv"
)

type reportedCode struct {
	Addr  uint64   `json:"addr"`
	Name  string   `json:"name"`
	File  string   `json:"file"`
	First int      `json:"first"`
	Size  int      `json:"size"`
	Table string   `json:"table"`
	Lines [][3]int `json:"lines"`
}

// TestCodeObjects runs every interpreter of the machine on a module of functions (nested,
// methods, comprehensions, coroutines, generators, non-ASCII names and file, a line table
// with long jumps), then reads each code object from the live process as the naming does and
// compares name, file, first line and the line of every instruction with what the
// interpreter itself reports (co_lines(), dis.findlinestarts() on 3.9).
func TestCodeObjects(t *testing.T) {
	for _, py := range testenv.EveryPython(t) {
		t.Run(py.Name, func(t *testing.T) {
			script, err := filepath.Abs("testdata/codeobjects.py")
			if err != nil {
				t.Fatal(err)
			}
			cmd := py.Command(py.Script(t, script))
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { stdin.Close(); cmd.Wait() }()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("read report: %v", err)
			}
			var codes []reportedCode
			if err := json.Unmarshal([]byte(line), &codes); err != nil {
				t.Fatal(err)
			}
			pid, err := testenv.ProgramPID(cmd)
			if err != nil {
				t.Fatal(err)
			}
			img := mappedImage(t, pid, py)
			mem := ProcessMemory(pid)
			if len(codes) < 10 {
				t.Fatalf("%d code objects reported", len(codes))
			}
			for _, want := range codes {
				table, _ := hex.DecodeString(want.Table)
				ranges := decodeLines(img.Version.Minor, table, want.First)
				bad := 0
				for off := 0; off < want.Size; off += 2 {
					exp := -1
					for _, r := range want.Lines {
						if r[0] <= off && off < r[1] {
							exp = r[2]
						}
					}
					if got := lineAt(ranges, off); got != exp && bad < 3 {
						bad++
						t.Errorf("%s: line at %d: %d, the interpreter says %d", want.Name, off, got, exp)
					}
				}
				c, err := img.ReadCode(mem, want.Addr)
				if err != nil {
					t.Errorf("read %s at %#x: %v", want.Name, want.Addr, err)
					continue
				}
				if c.Name != want.Name || c.File != want.File || c.FirstLine != want.First {
					t.Errorf("read %q %q %d, want %q %q %d", c.Name, c.File, c.FirstLine, want.Name, want.File, want.First)
				}
				if len(c.lines) != len(ranges) {
					t.Errorf("%s: %d line ranges read from the process, %d from the report", want.Name, len(c.lines), len(ranges))
				}
			}
			// Not a code object: the first code object's name string.
			if _, err := img.ReadCode(mem, codes[0].Addr+8); err == nil {
				t.Error("a misaligned address read as a code object")
			}
		})
	}
}

// mappedImage finds the interpreter file in the process's mappings and places it.
func mappedImage(t *testing.T, pid int, py testenv.Python) *Image {
	t.Helper()
	// A contained process's mappings show its files by their path on the host.
	lib := py.Lib
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in, err := Inspect(f)
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		var start, end, off uint64
		var perms, dev, path string
		var inode int
		if n, _ := fmt.Sscanf(line, "%x-%x %s %x %s %d %s", &start, &end, &perms, &off, &dev, &inode, &path); n == 7 && path == lib && strings.Contains(perms, "x") {
			if bias, ok := in.Bias(start, off); ok {
				return NewImage(in, bias)
			}
		}
	}
	t.Fatalf("%s not mapped executable in pid %d", lib, pid)
	return nil
}

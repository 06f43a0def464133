package folded

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sonde-profiler/sonde/trace"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// testProfile covers what folded output must get right: two processes, inlined frames,
// a kernel frame, an unnamed frame, the same stack on two threads, names that would
// break a line or a stack, a sample without a process, one without frames, one without
// samples.
func testProfile() *trace.Profile {
	lib := &trace.Mapping{Start: 0x7f0000000000, End: 0x7f0000100000, Path: "/usr/lib/libc.so.6"}
	kernel := &trace.Mapping{Path: trace.KernelPath}
	loc := func(kind trace.FrameKind, m *trace.Mapping, addr uint64, names ...string) *trace.Location {
		l := &trace.Location{Kind: kind, Mapping: m, Address: addr}
		for _, n := range names {
			l.Lines = append(l.Lines, trace.Line{Function: n, File: "src.c", Line: 1})
		}
		return l
	}
	main := loc(trace.FrameNative, nil, 0x1000, "main")
	work := loc(trace.FrameNative, nil, 0x1100, "inner", "middle", "work") // inner inlined in middle in work
	spin := loc(trace.FrameNative, nil, 0x1200, "spin")
	memcpy := loc(trace.FrameNative, lib, 0x7f0000001234) // unnamed
	sys := loc(trace.FrameKernel, kernel, 0xffffffff81000000, "do_syscall_64")
	goMain := loc(trace.FrameGo, nil, 0x2000, "main.main")
	hostile := loc(trace.FrameGo, nil, 0x2100, "main.(*T).a;b", "evil\nline\x1b[2J", "bad\xffutf8")
	app := &trace.Process{PID: 100, Name: "app"}
	app2 := &trace.Process{PID: 200, Name: "app"}
	gosvc := &trace.Process{PID: 300, Name: "go svc"}
	p := &trace.Profile{
		Start: time.Unix(1700000000, 0), End: time.Unix(1700000010, 0), Period: time.Second / 99,
		Samples: []*trace.Sample{
			{Process: app, TID: 100, Count: 7, Locations: []*trace.Location{spin, work, main}},
			{Process: app, TID: 101, Count: 3, Locations: []*trace.Location{spin, work, main}}, // same stack, other thread
			{Process: app, TID: 100, Count: 2, Locations: []*trace.Location{work, main}},
			{Process: app, TID: 100, Count: 4, Locations: []*trace.Location{sys, memcpy, main}},
			{Process: app2, TID: 200, Count: 1, Locations: []*trace.Location{spin, work, main}},
			{Process: gosvc, TID: 300, Count: 5, Locations: []*trace.Location{hostile, goMain}},
			{Process: gosvc, TID: 301, Count: 0, Locations: []*trace.Location{goMain}}, // no samples: no line
			{Process: nil, Count: 2, Locations: []*trace.Location{sys}},
			{Process: nil, Count: 1},
		},
	}
	p.Locations = []*trace.Location{main, work, spin, memcpy, sys, goMain, hostile}
	return p
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\ngot:\n%s\nwant:\n%s", name, got, want)
	}
}

func TestWriteGolden(t *testing.T) {
	for _, tc := range []struct {
		file string
		opts Options
	}{
		{"profile.folded", Options{}},
		{"profile-noprocess.folded", Options{OmitProcess: true}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteOptions(&buf, testProfile(), tc.opts); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, buf.Bytes())
			checkLines(t, buf.String())
		})
	}
}

// checkLines holds each line to the format: valid UTF-8, no control characters, frames
// then a space and a positive count; and lines sorted.
func checkLines(t *testing.T, text string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	prevStack := ""
	for i, l := range lines {
		if !utf8.ValidString(l) {
			t.Errorf("line %d is not UTF-8: %q", i+1, l)
		}
		if strings.ContainsAny(l, "\r\x1b\x00") {
			t.Errorf("line %d holds control characters: %q", i+1, l)
		}
		sp := strings.LastIndexByte(l, ' ')
		if sp <= 0 || strings.Trim(l[sp+1:], "0123456789") != "" || l[sp+1:] == "0" {
			t.Errorf("line %d does not end in a positive count: %q", i+1, l)
		}
		// Sorted by stack: "y 1" (stack "y") comes before "y 0 1" (stack "y 0").
		stack := l[:max(sp, 0)]
		if i > 0 && prevStack >= stack {
			t.Errorf("the stacks of lines %d and %d are not sorted and distinct", i, i+1)
		}
		prevStack = stack
	}
}

func TestWriteCounts(t *testing.T) {
	var buf bytes.Buffer
	if err := Write(&buf, testProfile()); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	// The two threads of app-100 share a line; app-200 keeps its own.
	for _, want := range []string{
		"app-100;main;work;middle;inner;spin 10\n",
		"app-200;main;work;middle;inner;spin 1\n",
		"app-100;main;0x7f0000001234 (/usr/lib/libc.so.6);do_syscall_64 4\n",
		`go svc-300;main.main;bad` + "\uFFFD" + `utf8;evil\x0aline\x1b[2J;main.(*T).a\x3bb 5` + "\n",
		"do_syscall_64 2\n",
		"[unknown] 1\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing line %q in:\n%s", want, text)
		}
	}
	if strings.Contains(text, "main.main 0") || strings.Count(text, "\n") != 7 {
		t.Errorf("want 7 lines and none for the sample without counts:\n%s", text)
	}
}

func TestReadRoundTrip(t *testing.T) {
	want, err := os.ReadFile(filepath.Join("testdata", "profile.folded"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := Read(bytes.NewReader(want))
	if err != nil {
		t.Fatal(err)
	}
	if p.TotalCount() != 25 {
		t.Errorf("total %d, want 25", p.TotalCount())
	}
	var got bytes.Buffer
	if err := Write(&got, p); err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("Read then Write changed the stacks:\ngot:\n%s\nwant:\n%s", got.String(), want)
	}
	// The process root became the process; frames became leaf-first locations.
	var found bool
	for _, s := range p.Samples {
		if s.Process != nil && s.Process.PID == 100 && s.Count == 10 {
			found = true
			var names []string
			for _, l := range s.Locations {
				names = append(names, l.Lines[0].Function)
			}
			if strings.Join(names, ",") != "spin,inner,middle,work,main" || s.Process.Name != "app" {
				t.Errorf("app-100 sample: process %+v, locations %v", s.Process, names)
			}
		}
	}
	if !found {
		t.Error("no sample of app-100 with count 10")
	}
	// Each distinct frame name is one location.
	seen := map[string]bool{}
	for _, l := range p.Locations {
		n := l.Lines[0].Function
		if seen[n] {
			t.Errorf("location %q listed twice", n)
		}
		seen[n] = true
	}
}

func TestReadForeignInput(t *testing.T) {
	// CRLF, tabs, repeated stacks, an empty frame, blank lines, no trailing newline.
	in := "a;b;c 3\r\n\nb\t2\r\na;b;c  4\na;;c 1\n   \nb 0"
	p, err := Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Write(&out, p); err != nil {
		t.Fatal(err)
	}
	if want := "a;[unknown];c 1\na;b;c 7\nb 2\n"; out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
	for _, s := range p.Samples {
		if s.Process != nil {
			t.Errorf("frames without a PID became a process: %+v", s.Process)
		}
	}
}

func TestReadErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"a;b 1\nc;d\n", "line 2: no count"},
		{"a;b 1\n\nc;d x\n", `line 3: count "x" is not a whole number`},
		{"a 1.5\n", "line 1: count"},
		{"a -3\n", "line 1: count"},
		{"a 99999999999999999999\n", "line 1: count"},
		{"   5\n", "line 1: no frames before the count"},
		{"a 9223372036854775807\na 1\n", "line 2: the count of this stack overflows"},
		{"a;b 1\n" + strings.Repeat("x", MaxLineBytes+1) + " 1\n", "line 2: longer than"},
	} {
		_, err := Read(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Read(%.40q): error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

func TestReadLineOfMaxLength(t *testing.T) {
	frame := strings.Repeat("f", MaxLineBytes-2)
	p, err := Read(strings.NewReader(frame + " 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Samples) != 1 || p.Samples[0].Locations[0].Lines[0].Function != frame {
		t.Error("a line of exactly MaxLineBytes was not read whole")
	}
}

// FuzzRead: any input either fails with an error or reads into stacks that write
// back as valid folded lines, and reading those lines again changes nothing.
func FuzzRead(f *testing.F) {
	f.Add("a;b;c 3\nb 2\n")
	f.Add("app-12;main;x 1\r\n\n;; 4\n")
	f.Add("a\xff;\x1b[2J 9223372036854775807\n")
	f.Add("x 1 2\ny\t3")
	f.Fuzz(func(t *testing.T, in string) {
		p, err := Read(strings.NewReader(in))
		if err != nil {
			return
		}
		var once, twice bytes.Buffer
		if err := Write(&once, p); err != nil {
			t.Fatal(err)
		}
		if once.Len() > 0 {
			checkLines(t, once.String())
		}
		p2, err := Read(bytes.NewReader(once.Bytes()))
		if err != nil {
			t.Fatalf("cannot read what Write wrote: %v\n%q", err, once.String())
		}
		if err := Write(&twice, p2); err != nil {
			t.Fatal(err)
		}
		if once.String() != twice.String() {
			t.Fatalf("not stable:\n%q\n%q", once.String(), twice.String())
		}
	})
}

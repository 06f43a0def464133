package flame

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sonde-profiler/sonde/trace"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

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

// treeProfile: two processes, inlining, recursion, one function at two lines with
// different counts, two functions of one name in different files, a kernel frame, an
// unnamed frame, a hostile name, a sample without a process and one without frames.
func treeProfile() *trace.Profile {
	m := &trace.Mapping{Path: "/usr/bin/app"}
	line := func(fn, file string, n int64) trace.Line { return trace.Line{Function: fn, File: file, Line: n} }
	loc := func(kind trace.FrameKind, lines ...trace.Line) *trace.Location {
		return &trace.Location{Kind: kind, Mapping: m, Lines: lines}
	}
	main := loc(trace.FrameNative, line("main", "main.c", 5))
	workA := loc(trace.FrameNative, line("helper", "work.c", 12), line("work", "work.c", 30)) // helper inlined in work
	workB := loc(trace.FrameNative, line("work", "work.c", 31))
	rec := loc(trace.FrameNative, line("rec", "rec.c", 3))
	initA := loc(trace.FrameNative, line("init", "a.c", 1))
	initB := loc(trace.FrameNative, line("init", "b.c", 1))
	sys := loc(trace.FrameKernel, line("do_syscall_64", "", 0))
	unnamed := &trace.Location{Address: 0x4005, Mapping: m}
	evil := loc(trace.FrameGo, line("</script><b>x</b>&amp;\n\x1b[1m", "e\xffvil.go", 9))
	app := &trace.Process{PID: 100, Name: "app"}
	srv := &trace.Process{PID: 200, Name: "srv"}
	return &trace.Profile{
		Start: time.Unix(1700000000, 0), End: time.Unix(1700000010, 0), Period: time.Second / 100,
		Samples: []*trace.Sample{
			{Process: app, Count: 30, Locations: []*trace.Location{workA, main}},
			{Process: app, Count: 10, Locations: []*trace.Location{workB, main}},
			{Process: app, Count: 5, Locations: []*trace.Location{main}},
			{Process: app, Count: 8, Locations: []*trace.Location{rec, rec, rec, main}},
			{Process: app, Count: 4, Locations: []*trace.Location{initA, main}},
			{Process: app, Count: 2, Locations: []*trace.Location{initB, main}},
			{Process: srv, Count: 6, Locations: []*trace.Location{sys, unnamed}},
			{Process: srv, Count: 3, Locations: []*trace.Location{evil}},
			{Process: nil, Count: 1, Locations: []*trace.Location{sys}},
			{Process: app, Count: 0, Locations: []*trace.Location{rec}},
			{Process: nil, Count: 1},
		},
	}
}

func dump(t *Tree) string {
	var b strings.Builder
	walk(t.Root, func(n *Node, depth int) {
		fmt.Fprintf(&b, "%s%s", strings.Repeat("  ", depth), n.Name)
		if n.File != "" || n.Line != 0 {
			fmt.Fprintf(&b, " @%s:%d", n.File, n.Line)
		}
		if n.Kind != "" {
			fmt.Fprintf(&b, " [%s]", n.Kind)
		}
		fmt.Fprintf(&b, " self=%d total=%d\n", n.Self, n.Total)
	})
	return b.String()
}

func TestTreeGolden(t *testing.T) {
	tree := NewTree(treeProfile())
	golden(t, "tree.golden", []byte(dump(tree)))
	// Totals are exact: each node's total is its self plus its children's totals.
	walk(tree.Root, func(n *Node, _ int) {
		sum := n.Self
		for _, c := range n.Children {
			sum += c.Total
		}
		if sum != n.Total {
			t.Errorf("%s: self %d + children %d != total %d", n.Name, n.Self, sum-n.Self, n.Total)
		}
	})
	if tree.Root.Total != 70 {
		t.Errorf("root total %d, want 70", tree.Root.Total)
	}
}

func TestTop(t *testing.T) {
	rows := NewTree(treeProfile()).Top()
	got := map[string]Row{}
	for _, r := range rows {
		got[r.Name] = r
	}
	for _, want := range []Row{
		{"helper", 30, 30},
		{"work", 10, 40},
		{"rec", 8, 8}, // recursion counts once
		{"main", 5, 59},
		{"init", 6, 6}, // two files, one name
		{"do_syscall_64", 7, 7},
		{"0x4005 (/usr/bin/app)", 0, 6},
	} {
		if got[want.Name] != want {
			t.Errorf("%s: got %+v, want %+v", want.Name, got[want.Name], want)
		}
	}
	if _, ok := got["app-100"]; ok {
		t.Error("a process frame is in the top table")
	}
	if rows[0].Name != "helper" || rows[1].Name != "work" {
		t.Errorf("order: %v", rows[:2])
	}
}

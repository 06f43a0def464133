package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/sonde-profiler/sonde/internal/objfile"
	"github.com/sonde-profiler/sonde/reporter/folded"
	"github.com/sonde-profiler/sonde/reporter/otlp"
	"github.com/sonde-profiler/sonde/reporter/pprof"
	"github.com/sonde-profiler/sonde/trace"
)

// viewProfile has what the formats must carry through: two processes of one name,
// threads, inlined lines, kernel and unnamed frames, a name folded stacks escape.
func viewProfile() *trace.Profile {
	start := time.Unix(1700000000, 0)
	m := &trace.Mapping{Start: 0x400000, End: 0x500000, Offset: 0x1000, Path: "/usr/bin/app", File: &objfile.File{Path: "/usr/bin/app", GNUBuildID: "0123abcd"}}
	kernel := &trace.Mapping{Start: 0xffff800000000000, End: ^uint64(0), Path: trace.KernelPath}
	loc := func(kind trace.FrameKind, mp *trace.Mapping, addr uint64, names ...string) *trace.Location {
		l := &trace.Location{Kind: kind, Address: addr, Mapping: mp}
		for i, n := range names {
			l.Lines = append(l.Lines, trace.Line{Function: n, File: "app.c", Line: int64(10 + i)})
		}
		return l
	}
	main := loc(trace.FrameNative, m, 0x400100, "main")
	work := loc(trace.FrameNative, m, 0x400200, "helper", "work")
	spin := loc(trace.FrameNative, m, 0x400300, "spin")
	odd := loc(trace.FrameNative, m, 0x400400, "a;b\x1b[31m")
	unnamed := loc(trace.FrameNative, m, 0x400500)
	sys := loc(trace.FrameKernel, kernel, 0xffffffff81000010, "do_syscall_64")
	a := &trace.Process{PID: 100, Name: "app"}
	b := &trace.Process{PID: 101, Name: "app"}
	return &trace.Profile{
		Start: start, End: start.Add(10 * time.Second), Period: time.Second / 99,
		Locations: []*trace.Location{main, work, spin, odd, unnamed, sys},
		Samples: []*trace.Sample{
			{Process: a, TID: 100, ThreadName: "app", Count: 40, Locations: []*trace.Location{spin, work, main}},
			{Process: a, TID: 102, ThreadName: "worker", Count: 15, Locations: []*trace.Location{spin, work, main}},
			{Process: a, TID: 100, ThreadName: "app", Count: 7, Locations: []*trace.Location{sys, unnamed, main}},
			{Process: b, TID: 101, ThreadName: "app", Count: 9, Locations: []*trace.Location{odd, work, main}},
		},
	}
}

// view runs sonde view in this process and returns its exit status and output.
func view(t *testing.T, args ...string) (status int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	status = viewMain(args, &o, &e)
	return status, o.String(), e.String()
}

// pprof → OTLP → OTLP/JSON → folded, each step a sonde view command, and the last two
// read by content rather than name: the same stacks and counts come out.
func TestViewRoundTrip(t *testing.T) {
	dir := t.TempDir()
	orig := viewProfile()
	var pb bytes.Buffer
	if err := pprof.Write(&pb, orig); err != nil {
		t.Fatal(err)
	}
	path := func(name string) string { return filepath.Join(dir, name) }
	if err := os.WriteFile(path("a.pb.gz"), pb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	steps := []struct{ in, out, rename string }{
		{"a.pb.gz", "b.otlp.pb", "b.bin"},
		{"b.bin", "c.OTLP.json", "c.data"},
		{"c.data", "d.folded", ""},
	}
	for _, st := range steps {
		status, stdout, stderr := view(t, path(st.in), "--output", path(st.out))
		if status != 0 {
			t.Fatalf("view %s --output %s: status %d\n%s", st.in, st.out, status, stderr)
		}
		if !strings.Contains(stdout, "71 samples") || !strings.Contains(stdout, " 77.46%  77.46%  spin\n") {
			t.Errorf("view %s printed:\n%s", st.in, stdout)
		}
		if !strings.Contains(stderr, "wrote "+path(st.out)) {
			t.Errorf("view %s said:\n%s", st.in, stderr)
		}
		if st.rename != "" {
			if err := os.Rename(path(st.out), path(st.rename)); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := os.ReadFile(path("d.folded"))
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := folded.Write(&want, orig); err != nil {
		t.Fatal(err)
	}
	if string(got) != want.String() {
		t.Errorf("pprof → OTLP → OTLP/JSON → folded changed the stacks:\ngot:\n%s\nwant:\n%s", got, want.String())
	}
	// And back from folded to pprof: counts and stacks again.
	if status, _, stderr := view(t, path("d.folded"), "--output", path("e.pb.gz"), "--top", "0"); status != 0 {
		t.Fatalf("folded to pprof: %d\n%s", status, stderr)
	}
	f, err := os.Open(path("e.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back, err := pprof.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := folded.Write(&again, back); err != nil {
		t.Fatal(err)
	}
	if again.String() != want.String() {
		t.Errorf("folded → pprof changed the stacks:\n%s", again.String())
	}
}

// Several files merge; --focus and --pid keep what they select; flags may follow files.
func TestViewMergesAndFilters(t *testing.T) {
	dir := t.TempDir()
	one := filepath.Join(dir, "one.folded")
	two := filepath.Join(dir, "two.txt")
	os.WriteFile(one, []byte("app-1;main;spin 6\napp-2;main;idle 2\n"), 0o644)
	os.WriteFile(two, []byte("app-1;main;spin 4\napp-1;main;x\x1b[2J\x07 1\n"), 0o644)

	status, stdout, stderr := view(t, one, two)
	if status != 0 {
		t.Fatalf("status %d\n%s", status, stderr)
	}
	if !strings.HasPrefix(stdout, "13 samples\n") || !strings.Contains(stdout, "  0.00% 100.00%  main\n") || !strings.Contains(stdout, " 76.92%  76.92%  spin\n") {
		t.Errorf("merged table:\n%s", stdout)
	}
	if strings.ContainsAny(stdout, "\x1b\x07") || !strings.Contains(stdout, `x\x1b[2J\x07`) {
		t.Errorf("a name's escapes reached the terminal raw:\n%q", stdout)
	}
	out := filepath.Join(dir, "focus.folded")
	if status, _, stderr := view(t, one, "--focus", "^spin$", two, "--output", out, "--top", "0"); status != 0 {
		t.Fatalf("--focus: %d\n%s", status, stderr)
	}
	if got, _ := os.ReadFile(out); string(got) != "app-1;main;spin 10\n" {
		t.Errorf("--focus ^spin$ kept:\n%s", got)
	}
	if status, _, stderr := view(t, "--pid", "2", "--output", out, one, two); status != 0 {
		t.Fatalf("--pid: %d\n%s", status, stderr)
	}
	if got, _ := os.ReadFile(out); string(got) != "app-2;main;idle 2\n" {
		t.Errorf("--pid 2 kept:\n%s", got)
	}
}

// collectorRecord frames b as the Collector's file exporter does with format proto, or
// with compression: its length, 4 bytes big-endian, then b.
func collectorRecord(b []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// collectorForms writes two intervals of viewProfile in each form the Collector's file
// exporter writes, and in sonde's own OTLP/JSON, under names that do not tell the format.
func collectorForms(t *testing.T, dir string) (sondeJSON string, forms map[string]string) {
	t.Helper()
	var protos, jsons [][]byte
	for i := range 2 {
		p := viewProfile()
		p.Start = p.Start.Add(time.Duration(i) * 10 * time.Second)
		p.End = p.End.Add(time.Duration(i) * 10 * time.Second)
		req := otlp.Encode([]*trace.Profile{p}, otlp.Resource{}, otlp.EncodeOptions{Version: "test"})
		var pb, js bytes.Buffer
		if err := otlp.Write(&pb, false, req); err != nil {
			t.Fatal(err)
		}
		if err := otlp.Write(&js, true, req); err != nil {
			t.Fatal(err)
		}
		protos, jsons = append(protos, pb.Bytes()), append(jsons, js.Bytes())
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	perMessage := func(b []byte) []byte { return collectorRecord(enc.EncodeAll(b, nil)) }
	var native bytes.Buffer
	stream, err := zstd.NewWriter(&native)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range protos {
		stream.Write(collectorRecord(b))
		stream.Close() // the exporter ends a frame at each flush
		stream.Reset(&native)
	}
	contents := map[string][]byte{
		"json":         bytes.Join(jsons, nil),
		"proto":        bytes.Join([][]byte{collectorRecord(protos[0]), collectorRecord(protos[1])}, nil),
		"proto-zstd":   bytes.Join([][]byte{perMessage(protos[0]), perMessage(protos[1])}, nil),
		"json-zstd":    bytes.Join([][]byte{perMessage(bytes.TrimSpace(jsons[0])), perMessage(bytes.TrimSpace(jsons[1]))}, nil),
		"proto-native": native.Bytes(),
	}
	forms = map[string]string{}
	for name, b := range contents {
		forms[name] = filepath.Join(dir, "collector-"+name)
		if err := os.WriteFile(forms[name], b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The name of sonde's own files does not make view read the Collector's as one message.
	forms["proto named .otlp.pb"] = filepath.Join(dir, "collector.otlp.pb")
	if err := os.WriteFile(forms["proto named .otlp.pb"], contents["proto"], 0o644); err != nil {
		t.Fatal(err)
	}
	sondeJSON = filepath.Join(dir, "sonde.otlp.json")
	if err := os.WriteFile(sondeJSON, contents["json"], 0o644); err != nil {
		t.Fatal(err)
	}
	return sondeJSON, forms
}

// Every form of the Collector's file exporter reads as the same two intervals, which
// merge, filter and convert as any other input.
func TestViewReadsCollectorFiles(t *testing.T) {
	dir := t.TempDir()
	ref, forms := collectorForms(t, dir)
	want := filepath.Join(dir, "want.folded")
	if status, _, stderr := view(t, ref, "--output", want, "--top", "0"); status != 0 {
		t.Fatalf("view %s: status %d\n%s", ref, status, stderr)
	}
	wantFolded, err := os.ReadFile(want)
	if err != nil || len(wantFolded) == 0 {
		t.Fatalf("reference folded stacks: %q, %v", wantFolded, err)
	}
	for name, path := range forms {
		out := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".folded")
		status, stdout, stderr := view(t, path, "--output", out)
		if status != 0 {
			t.Errorf("%s: status %d\n%s", name, status, stderr)
			continue
		}
		if !strings.HasPrefix(stdout, "142 samples (") || !strings.Contains(stdout, " 77.46%  77.46%  spin\n") {
			t.Errorf("%s: two intervals of 71 samples printed:\n%s", name, stdout)
		}
		if got, _ := os.ReadFile(out); !bytes.Equal(got, wantFolded) {
			t.Errorf("%s: folded stacks\n%s\nwant, as from sonde's OTLP/JSON:\n%s", name, got, wantFolded)
		}
		if status, stdout, stderr := view(t, "--pid", "101", path); status != 0 || !strings.HasPrefix(stdout, "18 samples (") {
			t.Errorf("%s --pid 101: status %d, printed\n%s%s", name, status, stdout, stderr)
		}
	}
}

func TestViewErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "p.folded")
	os.WriteFile(good, []byte("main 1\n"), 0o644)
	html := filepath.Join(dir, "p.html")
	os.WriteFile(html, []byte("<html>"), 0o644)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o644)
	_, forms := collectorForms(t, dir)
	whole, _ := os.ReadFile(forms["proto"])
	cut := filepath.Join(dir, "cut")
	os.WriteFile(cut, whole[:len(whole)-100], 0o644)
	lying := filepath.Join(dir, "lying")
	os.WriteFile(lying, append(whole, 0x7f, 0xff, 0xff, 0xff, 1), 0o644)
	// Printable bytes after the magic: not to be taken for folded stacks.
	badZstd := filepath.Join(dir, "bad-zstd")
	os.WriteFile(badZstd, []byte("\x28\xb5\x2f\xfdabc"), 0o644)
	for _, tc := range []struct {
		args   []string
		status int
		want   string
	}{
		{nil, 2, "no profile to read"},
		{[]string{"--focus", "(", good}, 2, "--focus"},
		{[]string{"--pid", "x", good}, 2, "not a process ID"},
		{[]string{"--no-such-flag", good}, 2, "flag provided but not defined"},
		{[]string{good, "--output", filepath.Join(dir, "out.json")}, 2, "unknown format"},
		{[]string{filepath.Join(dir, "missing.pb.gz")}, 1, "no such file"},
		{[]string{html}, 1, "cannot be read back"},
		{[]string{empty}, 1, "empty file"},
		{[]string{cut}, 1, "read " + cut + ": decode OTLP profiles: record 2 at byte"},
		{[]string{cut}, 1, "the file is cut short"},
		{[]string{lying}, 1, "record 3 at byte " + strconv.Itoa(len(whole)) + ": its length says 2147483647 bytes but 1 follow"},
		{[]string{badZstd}, 1, "decode OTLP profiles: zstd: "},
		{[]string{"--help"}, 0, "Usage: sonde view"},
	} {
		status, _, stderr := view(t, tc.args...)
		if status != tc.status || !strings.Contains(stderr, tc.want) {
			t.Errorf("view %q: status %d, want %d, saying %q:\n%s", tc.args, status, tc.status, tc.want, stderr)
		}
	}
}

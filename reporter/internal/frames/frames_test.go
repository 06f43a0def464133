package frames

import (
	"testing"
	"unicode/utf8"

	"github.com/sonde-profiler/sonde/trace"
)

func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		"main.main":                      "main.main",
		"std::vector<int>::push_back":    "std::vector<int>::push_back",
		"héllo→":                         "héllo→",
		"a\nb\r\tc":                      `a\x0ab\x0d\x09c`,
		"\x1b[31mred\x1b[0m":             `\x1b[31mred\x1b[0m`,
		"bad\xff\xfeutf8":                "bad\uFFFD\uFFFDutf8",
		"c1\u009bcsi":                    `c1\u009bcsi`,
		"line\u2028sep":                  `line\u2028sep`,
		"evil\u202egnp.exe":              `evil\u202egnp.exe`,
		"iso\u2066x\u2069":               `iso\u2066x\u2069`,
		"del\x7f":                        `del\x7f`,
		"<script>&\"'</script>;a;b":      "<script>&\"'</script>;a;b", // escaping is each format's job
		string([]byte{0xe2, 0x82}) + "x": "\uFFFD\uFFFDx",
	} {
		got := Clean(in)
		if got != want {
			t.Errorf("Clean(%q) = %q, want %q", in, got, want)
		}
		if !utf8.ValidString(got) {
			t.Errorf("Clean(%q) = %q is not valid UTF-8", in, got)
		}
	}
}

func TestProcessName(t *testing.T) {
	for _, tc := range []struct {
		p    trace.Process
		want string
		name string // as parsed back
	}{
		{trace.Process{PID: 1234, Name: "python3"}, "python3-1234", "python3"},
		{trace.Process{PID: 7, Name: "worker-3"}, "worker-3-7", "worker-3"},
		{trace.Process{PID: 9, ExePath: "/usr/bin/app"}, "app-9", "app"},
		{trace.Process{PID: 0}, "unknown-0", "unknown"},
		{trace.Process{PID: 5, Name: "a\nb"}, `a\x0ab-5`, `a\x0ab`},
	} {
		got := ProcessName(&tc.p)
		if got != tc.want {
			t.Errorf("ProcessName(%+v) = %q, want %q", tc.p, got, tc.want)
		}
		name, pid, ok := ParseProcessName(got)
		if !ok || name != tc.name || pid != tc.p.PID {
			t.Errorf("ParseProcessName(%q) = %q, %d, %v", got, name, pid, ok)
		}
	}
	for _, frame := range []string{"main", "-12", "a-", "a-012", "a-+1", "a-99999999999", "a-1x"} {
		if _, _, ok := ParseProcessName(frame); ok {
			t.Errorf("ParseProcessName(%q) accepted a frame ProcessName does not write", frame)
		}
	}
}

func TestStackOrder(t *testing.T) {
	m := &trace.Mapping{Path: "/lib/x.so"}
	leaf := &trace.Location{Kind: trace.FrameNative, Lines: []trace.Line{
		{Function: "inner", File: "x.c", Line: 3}, {Function: "middle", File: "x.c", Line: 9}, {Function: "outer", File: "x.c", Line: 20}}}
	unnamed := &trace.Location{Address: 0xbeef, Mapping: m}
	noFunc := &trace.Location{Address: 0x10, Lines: []trace.Line{{File: "y.c", Line: 1}}}
	main := &trace.Location{Kind: trace.FrameGo, Lines: []trace.Line{{Function: "main"}}}
	s := &trace.Sample{Process: &trace.Process{PID: 3, Name: "p"}, Locations: []*trace.Location{leaf, unnamed, noFunc, main}}
	got := Stack(nil, s, true)
	want := []Frame{
		{Name: "p-3", Kind: KindProcess},
		{Name: "main", Kind: KindGo},
		{Name: "0x10", File: "y.c", Line: 1},
		{Name: "0xbeef (/lib/x.so)"},
		{Name: "outer", File: "x.c", Line: 20, Kind: KindNative},
		{Name: "middle", File: "x.c", Line: 9, Kind: KindNative},
		{Name: "inner", File: "x.c", Line: 3, Kind: KindNative},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d frames %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("frame %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if got := Stack(nil, s, false); got[0].Name != "main" {
		t.Errorf("without process the root is %q, want main", got[0].Name)
	}
}

package flame

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

func testFacts() Facts {
	f := FactsFrom(treeProfile())
	f.Host = "box</title><script>alert(1)</script>"
	f.Version = "v1.2.3"
	f.LostSamples = 4
	f.CommandLine = []string{"sonde", "--pid", "100", "--output", "out file.html", "it's"}
	f.Note = "The host was nearly idle.\x1b[1m"
	return f
}

func TestWriteHTMLContainsItsData(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, treeProfile(), testFacts()); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if strings.Contains(page, "@@") {
		t.Error("a placeholder was left in the page")
	}
	// The profile's strings cannot end the data's script element or start markup: only
	// the page's own two scripts close.
	if n := strings.Count(strings.ToLower(page), "</script"); n != 2 {
		t.Errorf("%d </script> in the page, want 2 (the page's own)", n)
	}
	if strings.Contains(page, "<b>x</b>") || strings.Contains(page, "<script>alert") {
		t.Error("a name or the host reached the page as markup")
	}
	if !strings.Contains(page, "<title>sonde flame graph: box&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;</title>") {
		t.Error("the title does not hold the escaped host name")
	}
	for _, forbidden := range []string{"http://", "https://", "src=", "href="} {
		if strings.Contains(page, forbidden) {
			t.Errorf("the page refers to something outside itself: %q", forbidden)
		}
	}
	m := regexp.MustCompile(`(?s)<script type="application/json" id="sonde-data">(.*?)</script>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no data script")
	}
	var d pageData
	if err := json.Unmarshal([]byte(m[1]), &d); err != nil {
		t.Fatalf("the page's data is not JSON: %v", err)
	}
	if len(d.Nodes)%nodeFields != 0 || len(d.Nodes)/nodeFields != 15 {
		t.Fatalf("%d node numbers, want 15 nodes of %d", len(d.Nodes), nodeFields)
	}
	if d.Strings[d.Nodes[0]] != "all" || d.Nodes[5] != 70 {
		t.Errorf("first node: %q total %d, want all 70", d.Strings[d.Nodes[0]], d.Nodes[5])
	}
	names := map[string]bool{}
	for i := 0; i < len(d.Nodes); i += nodeFields {
		names[d.Strings[d.Nodes[i]]] = true
	}
	for _, want := range []string{"app-100", "helper", `</script><b>x</b>&amp;\x0a\x1b[1m`, "0x4005 (/usr/bin/app)"} {
		if !names[want] {
			t.Errorf("node %q missing from the data", want)
		}
	}
	if len(d.Top) == 0 || d.Strings[d.Top[0][0]] != "helper" || d.Top[0][1] != 30 {
		t.Errorf("top row %v", d.Top[:1])
	}
	f := d.Facts
	if f.Samples != 70 || *f.Lost != 4 || f.Frequency != 100 || f.Duration != 10 || len(f.Processes) != 2 ||
		f.Processes[0] != (processJSON{PID: 100, Name: "app", Samples: 59}) {
		t.Errorf("facts %+v", f)
	}
	if f.Command != `sonde --pid 100 --output 'out file.html' 'it'\''s'` {
		t.Errorf("command %s", f.Command)
	}
	if f.Note != `The host was nearly idle.\x1b[1m` {
		t.Errorf("note %q, want the run's note, made printable", f.Note)
	}
}

// TestPageLayoutAndProcessList: the page opens in the icicle layout with the flame
// layout a choice away, and has the folded, filtered process list its script fills.
func TestPageLayoutAndProcessList(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, treeProfile(), testFacts()); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, want := range []string{
		`<input id="icicle" type="radio" name="layout" value="icicle" checked>`,
		`<input id="flame" type="radio" name="layout" value="flame">`,
		`<details id="processes" hidden>`,
		`<input id="processes-filter" type="search"`,
		`<ul id="processes-list"></ul>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if n := strings.Count(page, " checked>"); n != 1 {
		t.Errorf("the page has %d checked inputs, want only the icicle layout's", n)
	}
	if !strings.Contains(asset("flame.js"), "icicle = true") {
		t.Error("flame.js does not start in the icicle layout the page's toggle shows")
	}
}

// TestScriptsWriteTextOnly: the scripts put profile strings into the document as text;
// none of the ways to insert markup appears in them.
func TestScriptsWriteTextOnly(t *testing.T) {
	for _, name := range []string{"flame.js", "svg.js"} {
		a := asset(name)
		for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "createContextualFragment", "DOMParser", "eval("} {
			if strings.Contains(a, bad) {
				t.Errorf("%s uses %s", name, bad)
			}
		}
	}
}

// TestPageListsAHostsProcesses: a busy host's hundreds of processes are all in the
// page's data, so that its filter finds any of them; past maxProcesses the page only
// counts them.
func TestPageListsAHostsProcesses(t *testing.T) {
	for _, n := range []int{1, 253, maxProcesses + 7} {
		f := Facts{Samples: int64(n)}
		for i := range n {
			f.Processes = append(f.Processes, Process{PID: uint32(1000 + i), Name: fmt.Sprintf("compile\x1b%d", i), Samples: 1})
		}
		j := newFactsJSON(f)
		if len(j.Processes) != min(n, maxProcesses) || len(j.Processes)+j.ProcessesMore != n {
			t.Errorf("%d processes: %d listed and %d more, want %d listed and the rest counted", n, len(j.Processes), j.ProcessesMore, min(n, maxProcesses))
			continue
		}
		if last := j.Processes[len(j.Processes)-1]; last.PID != uint32(1000+len(j.Processes)-1) || last.Name != fmt.Sprintf(`compile\x1b%d`, len(j.Processes)-1) {
			t.Errorf("%d processes: the last listed is %+v", n, last)
		}
	}
}

func TestAssetsCannotEndTheirElements(t *testing.T) {
	for _, name := range []string{"flame.js", "flame.css"} {
		a := strings.ToLower(asset(name))
		for _, bad := range []string{"</script", "</style", "<!--", "@@"} {
			if strings.Contains(a, bad) {
				t.Errorf("%s contains %q", name, bad)
			}
		}
	}
}

func TestFactsFrom(t *testing.T) {
	f := FactsFrom(treeProfile())
	if f.Samples != 70 || f.LostSamples != -1 || f.Frequency != 100 || f.End.Sub(f.Start) != 10*time.Second {
		t.Errorf("facts %+v", f)
	}
	if len(f.Processes) != 2 || f.Processes[1] != (Process{PID: 200, Name: "srv", Samples: 9}) {
		t.Errorf("processes %+v", f.Processes)
	}
}

package flame

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/sonde-profiler/sonde/trace"
)

type svgG struct {
	class, title string
	x, w, d      int64
	rectY, rectW float64
	text         string
}

// parseSVG reads the frames of an SVG with a strict XML parser: any well-formedness
// error fails the test.
func parseSVG(t *testing.T, data []byte) (frames []svgG, root map[string]string) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	root = map[string]string{}
	var cur *svgG
	var in string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range tok.Attr {
				attr[a.Name.Local] = a.Value
			}
			switch tok.Name.Local {
			case "svg":
				root = attr
				if tok.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("svg element in namespace %q", tok.Name.Space)
				}
			case "g":
				if c := attr["class"]; c == "f" || c == "m" {
					cur = &svgG{class: c}
					cur.x, _ = strconv.ParseInt(attr["data-x"], 10, 64)
					cur.w, _ = strconv.ParseInt(attr["data-w"], 10, 64)
					cur.d, _ = strconv.ParseInt(attr["data-d"], 10, 64)
				}
			case "rect":
				if cur != nil {
					cur.rectY, _ = strconv.ParseFloat(attr["y"], 64)
					cur.rectW, _ = strconv.ParseFloat(attr["width"], 64)
				}
			}
			in = tok.Name.Local
		case xml.CharData:
			if cur != nil && in == "title" {
				cur.title += string(tok)
			}
			if cur != nil && in == "text" {
				cur.text += string(tok)
			}
		case xml.EndElement:
			in = ""
			if tok.Name.Local == "g" && cur != nil {
				frames = append(frames, *cur)
				cur = nil
			}
		}
	}
	return frames, root
}

func TestSVGHoldsEveryFrame(t *testing.T) {
	p := treeProfile()
	var buf bytes.Buffer
	if err := WriteSVG(&buf, p, testFacts()); err != nil {
		t.Fatal(err)
	}
	frames, root := parseSVG(t, buf.Bytes())
	if root["data-total"] != "70" {
		t.Errorf("data-total %q, want 70", root["data-total"])
	}
	byName := map[string][]svgG{}
	for _, f := range frames {
		if f.class != "f" {
			t.Errorf("a frame of the small profile was merged: %+v", f)
			continue
		}
		name, _, _ := strings.Cut(f.title, "\n")
		byName[name] = append(byName[name], f)
	}
	scale := (svgWidth - 2*svgPad) / 70
	n := 0
	walk(NewTree(p).Root, func(node *Node, depth int) {
		n++
		var found bool
		for _, f := range byName[node.Name] {
			if f.w == node.Total && f.d == int64(depth) {
				found = true
				want := fmt.Sprintf("\n%d samples, %s\nself: %d samples, %s", node.Total, pct(node.Total, 70), node.Self, pct(node.Self, 70))
				if !strings.Contains(f.title, want) {
					t.Errorf("%s: title %q lacks %q", node.Name, f.title, want)
				}
				if d := f.rectW - float64(node.Total)*scale; d > 0.01 || d < -0.01 {
					t.Errorf("%s: width %.2f px, want %.2f", node.Name, f.rectW, float64(node.Total)*scale)
				}
			}
		}
		if !found {
			t.Errorf("no frame %q with %d samples at depth %d", node.Name, node.Total, depth)
		}
	})
	if len(frames) != n {
		t.Errorf("%d frames drawn, want the tree's %d nodes", len(frames), n)
	}
	// The hostile name comes back whole from the XML, and its file with it.
	evil := byName[`</script><b>x</b>&amp;\x0a\x1b[1m`]
	if len(evil) != 1 || !strings.Contains(evil[0].title, "\ne\uFFFDvil.go:9\n") {
		t.Errorf("hostile frame: %+v", evil)
	}
	if f := byName["helper"]; len(f) != 1 || f[0].text != "helper (42.86%)" || !strings.Contains(f[0].title, "\nwork.c:12\n") {
		t.Errorf("helper frame: %+v", f)
	}
	if strings.Contains(buf.String(), "<b>") || strings.Count(buf.String(), "]]>") != 2 {
		t.Error("markup or a CDATA end leaked from a name")
	}
}

// TestSVGIsAnIcicle: the roots are drawn on top, each level a row below its caller,
// so that a deep stack cannot push them out of the first screen; the root tells the
// script where the rows are, to turn the graph over.
func TestSVGIsAnIcicle(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteSVG(&buf, treeProfile(), testFacts()); err != nil {
		t.Fatal(err)
	}
	frames, root := parseSVG(t, buf.Bytes())
	if len(frames) == 0 {
		t.Fatal("no frames")
	}
	deepest := int64(0)
	for _, f := range frames {
		if want := svgTop + float64(f.d)*svgFrameH; f.rectY != want {
			t.Errorf("frame %q at depth %d: y %.2f, want %.2f", strings.SplitN(f.title, "\n", 2)[0], f.d, f.rectY, want)
		}
		deepest = max(deepest, f.d)
	}
	if root["data-depth"] != strconv.FormatInt(deepest, 10) || root["data-frames-top"] != num(svgTop) || root["data-frame-height"] != num(svgFrameH) {
		t.Errorf("svg attributes %v; want depth %d, frames from %s px, %s px a row", root, deepest, num(svgTop), num(svgFrameH))
	}
	h, _ := strconv.ParseFloat(root["height"], 64)
	if want := svgTop + float64(deepest+1)*svgFrameH + svgBottom; h != want {
		t.Errorf("height %.2f, want %.2f", h, want)
	}
}

func TestSVGAssetsStayInCDATA(t *testing.T) {
	for _, name := range []string{"svg.js", "svg.css"} {
		if strings.Contains(asset(name), "]]>") {
			t.Errorf("%s contains ]]>, which would end its CDATA section", name)
		}
	}
}

// TestSVGMergesNarrowFrames: a thousand callees of one sample each are each narrower
// than the SVG draws; they become one box whose count is exact.
func TestSVGMergesNarrowFrames(t *testing.T) {
	main := &trace.Location{Lines: []trace.Line{{Function: "main"}}}
	hot := &trace.Location{Lines: []trace.Line{{Function: "hot"}}}
	p := &trace.Profile{Samples: []*trace.Sample{{Count: 1_000_000, Locations: []*trace.Location{hot, main}}}}
	for i := range 1000 {
		l := &trace.Location{Lines: []trace.Line{{Function: fmt.Sprintf("tiny%04d", i)}}}
		leaf := &trace.Location{Lines: []trace.Line{{Function: "leaf"}}}
		p.Samples = append(p.Samples, &trace.Sample{Count: 1, Locations: []*trace.Location{leaf, l, main}})
	}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, p, Facts{}); err != nil {
		t.Fatal(err)
	}
	frames, _ := parseSVG(t, buf.Bytes())
	var names []string
	var merged []svgG
	for _, f := range frames {
		if f.class == "m" {
			merged = append(merged, f)
			continue
		}
		name, _, _ := strings.Cut(f.title, "\n")
		names = append(names, name)
	}
	if strings.Join(names, ",") != "all,main,hot" {
		t.Errorf("drawn frames %v, want all, main, hot", names)
	}
	if len(merged) != 1 || merged[0].w != 1000 || merged[0].d != 2 || !strings.HasPrefix(merged[0].title, "1000 frames too narrow") {
		t.Errorf("merged boxes %+v, want one of 1000 frames and samples at depth 2", merged)
	}
}

func TestSVGEmptyProfile(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteSVG(&buf, &trace.Profile{}, Facts{}); err != nil {
		t.Fatal(err)
	}
	frames, root := parseSVG(t, buf.Bytes())
	if len(frames) != 0 || root["data-total"] != "0" {
		t.Errorf("empty profile: %d frames, total %q", len(frames), root["data-total"])
	}
}

// FuzzSVGNames: whatever a function or file name holds, the SVG is well-formed XML
// and gives the name back as its printable form.
func FuzzSVGNames(f *testing.F) {
	for _, s := range []string{"main", "]]></script><script>alert(1)</script>", "a\x00b\x1b\xff&#x0;", "\uFFFE\U0010FFFF"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, name, file string) {
		l := &trace.Location{Lines: []trace.Line{{Function: name, File: file, Line: 1}}}
		p := &trace.Profile{Samples: []*trace.Sample{{Count: 1, Locations: []*trace.Location{l}}}}
		var buf bytes.Buffer
		if err := WriteSVG(&buf, p, Facts{Host: name, Version: file}); err != nil {
			t.Fatal(err)
		}
		frames, _ := parseSVG(t, buf.Bytes())
		if len(frames) != 2 {
			t.Fatalf("%d frames, want all and the function", len(frames))
		}
		got, _, _ := strings.Cut(frames[1].title, "\n")
		if want := esc(NewTree(p).Root.Children[0].Name); esc(got) != want {
			t.Errorf("name %q came back as %q", name, got)
		}
	})
}

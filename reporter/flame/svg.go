package flame

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"hash/fnv"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sonde-profiler/sonde/reporter/internal/frames"
	"github.com/sonde-profiler/sonde/trace"
)

// SVG geometry, in px. Labels are monospace, so their width is known without a browser.
const (
	svgWidth    = 1200.0
	svgPad      = 10.0
	svgFrameH   = 16.0
	svgTop      = 86.0 // title, facts, buttons and the details line above the frames
	svgBottom   = 10.0 // a margin below the frames
	svgFontSize = 12.0
	svgCharW    = 0.6 * svgFontSize
	// svgMinW is the narrowest frame drawn: narrower siblings are drawn as one box,
	// and nothing under them is drawn, which bounds the file however large the tree.
	// flamegraph.pl draws down to 0.1 px; at a quarter pixel a tree of 100k nodes
	// still loads in a second or two rather than six.
	svgMinW = 0.25
)

// WriteSVG writes p as a standalone SVG flame graph. It is drawn as an icicle, roots
// on top, so that a viewer sees them first however deep the stacks are. Its inline
// script makes it interactive when opened on its own in a browser: hover shows a
// frame's details, click zooms into a frame (and its caller zooms back out), Search
// highlights the frames whose name matches a regular expression and sums their
// samples, a button turns it into a classic flame graph, roots at the bottom. Frames
// narrower than a quarter pixel are left out, their runs drawn as one hatched
// box, so the search sums what is drawn; every drawn frame's count is exact.
//
// Every profile string is escaped for XML; the output is well-formed XML whatever
// the names hold.
func WriteSVG(w io.Writer, p *trace.Profile, facts Facts) error {
	t := NewTree(p)
	bw := bufio.NewWriter(w)
	s := &svgWriter{w: bw, total: t.Root.Total}
	s.layout(t.Root)
	height := svgTop + float64(s.maxDepth+1)*svgFrameH + svgBottom
	fmt.Fprintf(bw, `<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="%s" height="%s" viewBox="0 0 %[1]s %[2]s" data-total="%d" data-depth="%d" data-frames-top="%s" data-frame-height="%s">
<style><![CDATA[
%s]]></style>
<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#e6e6e6"/><rect width="3" height="6" fill="#c8c8c8"/></pattern></defs>
<rect width="100%%" height="100%%" fill="#f8f8f8"/>
`, num(svgWidth), num(height), s.total, s.maxDepth, num(svgTop), num(svgFrameH), asset("svg.css"))
	mid, left, right := num(svgWidth/2), num(svgPad), num(svgWidth-svgPad)
	fmt.Fprintf(bw, "<text id=\"title\" x=\"%s\" y=\"22\" text-anchor=\"middle\">%s</text>\n", mid, esc(svgTitle(facts)))
	fmt.Fprintf(bw, "<text id=\"facts\" x=\"%s\" y=\"40\" text-anchor=\"middle\">%s</text>\n", mid, esc(svgFacts(facts)))
	fmt.Fprintf(bw, "<text id=\"reset\" x=\"%s\" y=\"58\" class=\"button\" visibility=\"hidden\">Reset zoom</text>\n", left)
	fmt.Fprintf(bw, "<text id=\"layout\" x=\"%s\" y=\"58\" class=\"button\" text-anchor=\"middle\">Flame layout</text>\n", mid)
	fmt.Fprintf(bw, "<text id=\"search\" x=\"%s\" y=\"58\" class=\"button\" text-anchor=\"end\">Search</text>\n", right)
	fmt.Fprintf(bw, "<text id=\"matched\" x=\"%s\" y=\"76\" text-anchor=\"end\"> </text>\n", right)
	fmt.Fprintf(bw, "<text id=\"details\" x=\"%s\" y=\"76\"> </text>\n<g id=\"frames\">\n", left)
	for _, f := range s.frames {
		s.writeFrame(f)
	}
	fmt.Fprintf(bw, "</g>\n<script type=\"text/ecmascript\"><![CDATA[\n%s]]></script>\n</svg>\n", asset("svg.js"))
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write flame graph svg: %w", err)
	}
	return nil
}

type svgFrame struct {
	n      *Node // nil for a box of merged narrow frames
	x, w   int64 // in samples from the root's left edge
	depth  int
	merged int
}

type svgWriter struct {
	w        *bufio.Writer
	total    int64
	frames   []svgFrame
	maxDepth int
}

func (s *svgWriter) scale() float64 {
	return (svgWidth - 2*svgPad) / float64(s.total)
}

// layout places the frames wide enough to draw, parents before children; children
// sit left to right from their parent's left edge, its self samples to their right.
func (s *svgWriter) layout(root *Node) {
	if s.total <= 0 {
		return
	}
	minSamples := svgMinW / s.scale()
	type item struct {
		n     *Node
		x     int64
		depth int
	}
	todo := []item{{root, 0, 0}}
	for len(todo) > 0 {
		it := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		s.add(svgFrame{n: it.n, x: it.x, w: it.n.Total, depth: it.depth})
		x := it.x
		var runX, runW int64
		runN := 0
		flush := func() {
			if runN > 0 && float64(runW) >= minSamples {
				s.add(svgFrame{x: runX, w: runW, depth: it.depth + 1, merged: runN})
			}
			runN, runW = 0, 0
		}
		for _, c := range it.n.Children {
			if float64(c.Total) < minSamples {
				if runN == 0 {
					runX = x
				}
				runN++
				runW += c.Total
			} else {
				flush()
				todo = append(todo, item{c, x, it.depth + 1})
			}
			x += c.Total
		}
		flush()
	}
}

func (s *svgWriter) add(f svgFrame) {
	s.frames = append(s.frames, f)
	s.maxDepth = max(s.maxDepth, f.depth)
}

func (s *svgWriter) writeFrame(f svgFrame) {
	x := svgPad + float64(f.x)*s.scale()
	w := float64(f.w) * s.scale()
	// Roots on top, an icicle: however deep the deepest stack, the roots are where a
	// viewer looks first. The script can turn it over.
	y := svgTop + float64(f.depth)*svgFrameH
	if f.n == nil {
		fmt.Fprintf(s.w, `<g class="m" data-x="%d" data-w="%d" data-d="%d"><title>%d frames too narrow to draw&#xA;%d samples, %s</title><rect x="%s" y="%s" width="%s" height="%s" fill="url(#hatch)"/></g>
`, f.x, f.w, f.depth, f.merged, f.w, pct(f.w, s.total), num(x), num(y), num(w), num(svgFrameH-1))
		return
	}
	n := f.n
	var title strings.Builder
	title.WriteString(n.Name)
	if n.File != "" {
		title.WriteString("\n" + n.File)
		if n.Line != 0 {
			title.WriteString(":" + strconv.FormatInt(n.Line, 10))
		}
	}
	fmt.Fprintf(&title, "\n%d samples, %s\nself: %d samples, %s", n.Total, pct(n.Total, s.total), n.Self, pct(n.Self, s.total))
	fmt.Fprintf(s.w, `<g class="f" data-x="%d" data-w="%d" data-d="%d"><title>%s</title><rect x="%s" y="%s" width="%s" height="%s" fill="%s"/><text x="%s" y="%s">%s</text></g>
`, f.x, f.w, f.depth, esc(title.String()), num(x), num(y), num(w), num(svgFrameH-1), svgColour(n, f.depth),
		num(x+3), num(y+svgFrameH-4.5), esc(fitLabel(n.Name+" ("+pct(n.Total, s.total)+")", w)))
}

// fitLabel shortens a label to the characters that fit in width px, as the script
// does after a zoom.
func fitLabel(label string, width float64) string {
	fit := int((width - 6) / svgCharW)
	if fit < 3 {
		return ""
	}
	if utf8.RuneCountInString(label) <= fit {
		return label
	}
	r := []rune(label)
	return string(r[:fit-2]) + ".."
}

func pct(v, of int64) string {
	if of <= 0 {
		return "0.00%"
	}
	return strconv.FormatFloat(100*float64(v)/float64(of), 'f', 2, 64) + "%"
}

func num(v float64) string {
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// esc escapes text for XML content and attribute values; xml.EscapeText also turns
// what XML cannot hold at all into U+FFFD.
func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// runtimeKind tells a language runtime's frames from the kinds every profile has.
func runtimeKind(kind string) bool {
	switch kind {
	case "", "native", "kernel", "go", "process":
		return false
	}
	return true
}

// runtimeHue gives each runtime's frames greens and teals of their own, between the
// native reds and Go's blues: 70 to 150 by the hash of the runtime's name, as flame.js.
func runtimeHue(kind string) float64 {
	h := fnv.New32a()
	h.Write([]byte(kind))
	return 70 + 80*float64(h.Sum32())/(1<<32)
}

func svgColour(n *Node, depth int) string {
	h := fnv.New32a()
	h.Write([]byte(n.Name))
	v := float64(h.Sum32()) / (1 << 32)
	switch {
	case depth == 0:
		return "hsl(0,0%,80%)"
	case n.Kind == "process":
		return fmt.Sprintf("hsl(220,14%%,%.1f%%)", 74+8*v)
	case n.Kind == "kernel":
		return fmt.Sprintf("hsl(%.1f,80%%,%.1f%%)", 22+14*v, 60+8*v)
	case n.Kind == "go":
		return fmt.Sprintf("hsl(%.1f,55%%,%.1f%%)", 180+25*v, 62+10*v)
	case runtimeKind(n.Kind):
		return fmt.Sprintf("hsl(%.1f,50%%,%.1f%%)", runtimeHue(n.Kind)+30*v, 60+10*v)
	default:
		return fmt.Sprintf("hsl(%.1f,82%%,%.1f%%)", 2+52*v, 62+8*v)
	}
}

func svgTitle(f Facts) string {
	if f.Host != "" {
		return "Flame graph: " + frames.Clean(f.Host)
	}
	return "Flame graph"
}

func svgFacts(f Facts) string {
	var parts []string
	if len(f.Processes) == 1 {
		parts = append(parts, fmt.Sprintf("%s (%d)", frames.Clean(f.Processes[0].Name), f.Processes[0].PID))
	} else if len(f.Processes) > 1 {
		parts = append(parts, fmt.Sprintf("%d processes", len(f.Processes)))
	}
	if !f.Start.IsZero() {
		parts = append(parts, f.Start.Format("2006-01-02 15:04:05 MST"))
	}
	if !f.Start.IsZero() && f.End.After(f.Start) {
		parts = append(parts, fmt.Sprintf("%.1f s", f.End.Sub(f.Start).Seconds()))
	}
	if f.Frequency > 0 {
		parts = append(parts, strconv.FormatFloat(f.Frequency, 'f', -1, 64)+" Hz")
	}
	parts = append(parts, fmt.Sprintf("%d samples", f.Samples))
	if f.LostSamples >= 0 {
		parts = append(parts, fmt.Sprintf("%d lost", f.LostSamples))
	}
	if f.Version != "" {
		parts = append(parts, "sonde "+frames.Clean(f.Version))
	}
	return strings.Join(parts, " · ")
}

package e2e

// The flame graph page and SVG of reporter/flame in a real browser: Debian's chromium,
// headless, driven over the DevTools protocol. The pages are opened from file:// URLs,
// so they cannot have needed the network.

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/sonde-profiler/sonde/internal/testenv"
	"github.com/sonde-profiler/sonde/reporter/flame"
	"github.com/sonde-profiler/sonde/trace"
)

// hostileName is a frame name that would run script if a page put it in as markup.
const hostileName = `<img src=x onerror=pwned=1>`

// flameProfile is a known profile of 200 samples in one process, each frame at least
// 15 % wide so that its whole label fits:
//
//	main;alpha;beta;gamma      60
//	main;alpha;delta           40
//	main;<hostile>             50
//	main;zeta;eta (inlined)    30
//	main                       20
func flameProfile() *trace.Profile {
	loc := func(names ...string) *trace.Location {
		l := &trace.Location{Kind: trace.FrameNative}
		for i, n := range names {
			l.Lines = append(l.Lines, trace.Line{Function: n, File: "app.c", Line: int64(10 + i + len(n))})
		}
		return l
	}
	main, alpha, beta, gamma, delta := loc("main"), loc("alpha"), loc("beta"), loc("gamma"), loc("delta")
	hostile, zetaEta := loc(hostileName), loc("eta", "zeta")
	app := &trace.Process{PID: 42, Name: "app"}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return &trace.Profile{
		Start: start, End: start.Add(10 * time.Second), Period: time.Second / 20,
		Locations: []*trace.Location{main, alpha, beta, gamma, delta, hostile, zetaEta},
		Samples: []*trace.Sample{
			{Process: app, TID: 42, Count: 60, Locations: []*trace.Location{gamma, beta, alpha, main}},
			{Process: app, TID: 42, Count: 40, Locations: []*trace.Location{delta, alpha, main}},
			{Process: app, TID: 43, Count: 50, Locations: []*trace.Location{hostile, main}},
			{Process: app, TID: 42, Count: 30, Locations: []*trace.Location{zetaEta, main}},
			{Process: app, TID: 42, Count: 20, Locations: []*trace.Location{main}},
		},
	}
}

// flameWant is every frame of flameProfile with its share, as the page labels it.
var flameWant = map[string]string{
	"all": "100.00%", "app-42": "100.00%", "main": "100.00%", "alpha": "50.00%", "beta": "30.00%",
	"gamma": "30.00%", "delta": "20.00%", hostileName: "25.00%", "zeta": "15.00%", "eta": "15.00%",
}

type drawnFrame struct {
	ID      string  `json:"id"`
	Text    string  `json:"text"`
	Left    float64 `json:"left"`
	Top     float64 `json:"top"`
	Bottom  float64 `json:"bottom"`
	Width   float64 `json:"width"`
	Clipped bool    `json:"clipped"`
	Shown   bool    `json:"shown"`
	Match   bool    `json:"match"`
}

// drawnFramesJS lists the frames the page drew, as the layout engine placed them.
const drawnFramesJS = `Array.from(document.querySelectorAll("#frames .frame")).map(e => {
	const r = e.getBoundingClientRect(), s = getComputedStyle(e);
	return {id: e.getAttribute("data-id") || "", text: e.textContent, left: r.left, top: r.top, bottom: r.bottom, width: r.width,
		clipped: e.scrollWidth > e.clientWidth, shown: s.display !== "none" && s.visibility !== "hidden" && r.height > 0,
		match: e.classList.contains("match")};
})`

func byLabel(frames []drawnFrame) map[string]drawnFrame {
	m := map[string]drawnFrame{}
	for _, f := range frames {
		m[f.Text] = f
	}
	return m
}

func label(name string) string { return name + " (" + flameWant[name] + ")" }

// startBrowser runs a headless chromium for the test; under CI a missing chromium
// fails the test.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	exe := os.Getenv("SONDE_CHROMIUM")
	if exe == "" {
		exe = testenv.RequireTool(t, "chromium")
	}
	// A fresh profile directory per browser. It is removed after the browser's cleanups
	// (cleanups run last registered first): chromium's helper processes may still write
	// to it for a moment after the browser exits, which t.TempDir's cleanup fails on.
	profileDir, err := os.MkdirTemp("", "sonde-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.RemoveAll(profileDir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("cannot remove chromium's profile directory %s", profileDir)
	})
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox, // CI runs the tests as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(profileDir),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1800, 900),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	ctx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancelBrowser := chromedp.NewContext(ctx)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start %s: %v", exe, err)
	}
	return ctx
}

// artifactDir is where a test keeps what people should look at after it:
// $SONDE_TEST_ARTIFACTS when set (CI uploads it), else a temporary directory.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SONDE_TEST_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func fileURL(path string) string {
	return (&url.URL{Scheme: "file", Path: path}).String()
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1.5 }

func TestFlameHTMLInBrowser(t *testing.T) {
	ctx := startBrowser(t)
	page := filepath.Join(t.TempDir(), "flame.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	p := flameProfile()
	facts := flame.FactsFrom(p)
	facts.Host, facts.Version, facts.LostSamples = "testhost", "v0-test", 0
	facts.CommandLine = []string{"sonde", "--pid", "42", "--output", "flame.html"}
	if err := flame.WriteHTML(f, p, facts); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	var factsText, topText string
	var pwned bool
	err = chromedp.Run(ctx,
		chromedp.Navigate(fileURL(page)),
		chromedp.Poll(`window.sondeFlame && window.sondeFlame.ready`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Text(`#facts`, &factsText, chromedp.ByQuery),
		chromedp.Text(`#top tbody`, &topText, chromedp.ByQuery),
		chromedp.Evaluate(`typeof pwned !== "undefined" || document.querySelector("#frames img, #top img") !== null`, &pwned),
	)
	if err != nil {
		t.Fatal(err)
	}
	if pwned {
		t.Error("a function name ran as markup")
	}
	for _, want := range []string{"testhost", "app (42)", "200", "20 Hz", "10.0 s", "v0-test", "--pid 42"} {
		if !strings.Contains(factsText, want) {
			t.Errorf("the facts %q lack %q", factsText, want)
		}
	}
	if !strings.Contains(topText, "30.00%\t30.00%\tgamma") && !strings.Contains(topText, "30.00%30.00%gamma") {
		t.Errorf("top table lacks gamma at 30.00%% self and cum:\n%s", topText)
	}

	// The page opens in the icicle layout; drawing, hover, zoom and search work there
	// and, after the toggle, in the flame layout.
	checkFlameLayout(t, ctx, "icicle")
	shot := filepath.Join(artifactDir(t), "flame-html.png")
	var screen []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&screen, 100)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shot, screen, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)

	err = chromedp.Run(ctx,
		chromedp.Click(`#reset`, chromedp.ByQuery),
		chromedp.Evaluate(`(s => { s.value = ""; s.dispatchEvent(new Event("input")); })(document.getElementById("search"))`, nil),
		chromedp.Click(`#flame`, chromedp.ByQuery),
		chromedp.Poll(`window.sondeFlame.layout() === "flame" && window.sondeFlame.zoomed() === 0 && window.sondeFlame.matchedSamples() === 0`,
			nil, chromedp.WithPollingTimeout(10*time.Second)),
	)
	if err != nil {
		t.Fatal(err)
	}
	checkFlameLayout(t, ctx, "flame")
}

// checkFlameLayout checks the page of flameProfile, unzoomed and unsearched, in the
// layout it shows: every frame drawn in its row with its whole label and its width, the
// tooltip, a zoom and a search.
func checkFlameLayout(t *testing.T, ctx context.Context, layout string) {
	t.Helper()
	var graphWidth, graphLeft float64
	var frames []drawnFrame
	var shown string
	err := chromedp.Run(ctx,
		chromedp.Evaluate(`window.sondeFlame.layout()`, &shown),
		chromedp.Evaluate(`document.getElementById("frames").getBoundingClientRect().width`, &graphWidth),
		chromedp.Evaluate(`document.getElementById("frames").getBoundingClientRect().left`, &graphLeft),
		chromedp.Evaluate(drawnFramesJS, &frames),
	)
	if err != nil {
		t.Fatal(err)
	}
	if shown != layout {
		t.Fatalf("the page shows the %s layout, want %s", shown, layout)
	}
	if graphWidth < 800 {
		t.Fatalf("the graph is %.0f px wide; the window should give it more", graphWidth)
	}

	// Every function is drawn, labelled in full with its share, as wide as its share.
	drawn := byLabel(frames)
	for name, share := range flameWant {
		fr, ok := drawn[label(name)]
		if !ok {
			t.Errorf("%s: no frame labelled %q among %d drawn", layout, label(name), len(frames))
			continue
		}
		var pct float64
		fmt.Sscanf(share, "%f%%", &pct)
		if !fr.Shown || fr.Clipped || !near(fr.Width, graphWidth*pct/100) {
			t.Errorf("%s: %s: shown %v, label clipped %v, %.1f px wide; want shown, whole and %.1f px", layout, name, fr.Shown, fr.Clipped, fr.Width, graphWidth*pct/100)
		}
	}

	// Callers sit a row above their callees in the icicle layout, a row below in the
	// flame layout.
	row := 18.0
	if layout == "flame" {
		row = -row
	}
	for _, pair := range [][2]string{{"all", "app-42"}, {"app-42", "main"}, {"main", "alpha"}, {"beta", "gamma"}, {"zeta", "eta"}} {
		caller, callee := drawn[label(pair[0])], drawn[label(pair[1])]
		if !near(callee.Top-caller.Top, row) {
			t.Errorf("%s: %s at %.0f px, its callee %s at %.0f px; want the callee %+.0f px from it", layout, pair[0], caller.Top, pair[1], callee.Top, row)
		}
	}

	// Hover: the tooltip tells function, file:line, samples and share.
	gamma := drawn[label("gamma")]
	var tipText string
	err = chromedp.Run(ctx,
		chromedp.ActionFunc(func(ctx context.Context) error {
			return input.DispatchMouseEvent(input.MouseMoved, gamma.Left+gamma.Width/2, gamma.Top+5).Do(ctx)
		}),
		chromedp.WaitVisible(`#tooltip`, chromedp.ByQuery),
		chromedp.Text(`#tooltip`, &tipText, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gamma", "app.c:15", "60 samples", "30.00% of all"} {
		if !strings.Contains(tipText, want) {
			t.Errorf("%s: tooltip %q lacks %q", layout, tipText, want)
		}
	}

	// Click alpha: it now spans the graph, beta scales with it, alpha's sibling
	// subtrees are gone.
	alpha := drawn[label("alpha")]
	var zoomed int
	err = chromedp.Run(ctx,
		chromedp.Click(fmt.Sprintf(`#frames .frame[data-id="%s"]`, alpha.ID), chromedp.ByQuery),
		chromedp.Evaluate(drawnFramesJS, &frames),
		chromedp.Evaluate(`window.sondeFlame.zoomed()`, &zoomed),
	)
	if err != nil {
		t.Fatal(err)
	}
	drawn = byLabel(frames)
	if fr, ok := drawn[label("alpha")]; !ok || !near(fr.Width, graphWidth) || !near(fr.Left, graphLeft) {
		t.Errorf("%s: after the click alpha is %+v; want it across the %.0f px graph", layout, fr, graphWidth)
	}
	if fr := drawn[label("beta")]; !near(fr.Width, graphWidth*60/100) {
		t.Errorf("%s: after the zoom beta is %.1f px wide, want %.1f (60/100 of alpha)", layout, fr.Width, graphWidth*0.6)
	}
	if _, ok := drawn[label(hostileName)]; ok {
		t.Errorf("%s: a frame outside the zoomed one is still drawn", layout)
	}
	if fmt.Sprint(zoomed) != alpha.ID {
		t.Errorf("%s: the page says it zoomed to node %d, want %s", layout, zoomed, alpha.ID)
	}

	// Search "eta" matches beta, zeta and eta; eta runs inside zeta, so the share is
	// beta's 60 plus zeta's 30 samples, not 120.
	var matchText string
	err = chromedp.Run(ctx,
		chromedp.Click(`#reset`, chromedp.ByQuery),
		chromedp.SendKeys(`#search`, "eta", chromedp.ByQuery),
		chromedp.Text(`#match`, &matchText, chromedp.ByQuery),
		chromedp.Evaluate(drawnFramesJS, &frames),
	)
	if err != nil {
		t.Fatal(err)
	}
	if want := "Matched: 45.00% (90 of 200 samples)"; matchText != want {
		t.Errorf("%s: search shows %q, want %q", layout, matchText, want)
	}
	var matched []string
	for _, fr := range frames {
		if fr.Match {
			matched = append(matched, fr.Text)
		}
		if fr.Text == label("all") && !near(fr.Width, graphWidth) {
			t.Errorf("%s: after the reset the root is %.1f px wide, want %.0f", layout, fr.Width, graphWidth)
		}
	}
	if len(matched) != 3 {
		t.Errorf("%s: highlighted %v, want beta, zeta and eta", layout, matched)
	}
}

// deepProfile is a busy host's profile in small: 250 processes, _start outermost in
// each. One of them, cc1plus (4242), has a few percent of the samples in stacks 300
// frames deep, as a host's deepest stack is seldom its busiest; ld (700) and make (500)
// have most, 40 and 3 frames deep; a long tail has one to three samples each, the
// hostile name among them.
func deepProfile() *trace.Profile {
	locs := map[string]*trace.Location{}
	loc := func(name string) *trace.Location {
		l := locs[name]
		if l == nil {
			l = &trace.Location{Kind: trace.FrameNative, Lines: []trace.Line{{Function: name, File: "deep.c", Line: 1}}}
			locs[name] = l
		}
		return l
	}
	// stack gives the locations of names, outermost first, leaf first as samples hold them.
	stack := func(names ...string) []*trace.Location {
		s := make([]*trace.Location, len(names))
		for i, n := range names {
			s[len(names)-1-i] = loc(n)
		}
		return s
	}
	deep := []string{"_start", "main"}
	for i := 2; i < 300; i++ {
		deep = append(deep, fmt.Sprintf("step%03d", i))
	}
	branch := slices.Clone(deep[:150])
	for i := 150; i < 300; i++ {
		branch = append(branch, fmt.Sprintf("other%03d", i))
	}
	link := []string{"_start", "main"}
	for i := 2; i < 40; i++ {
		link = append(link, fmt.Sprintf("link%03d", i))
	}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := &trace.Profile{Start: start, End: start.Add(30 * time.Second), Period: time.Second / 19}
	cc := &trace.Process{PID: 4242, Name: "cc1plus"}
	ld := &trace.Process{PID: 700, Name: "ld"}
	mk := &trace.Process{PID: 500, Name: "make"}
	p.Samples = append(p.Samples,
		&trace.Sample{Process: cc, TID: 4242, Count: 30, Locations: stack(deep...)},
		&trace.Sample{Process: cc, TID: 4242, Count: 10, Locations: stack(branch...)},
		&trace.Sample{Process: ld, TID: 700, Count: 300, Locations: stack(link...)},
		&trace.Sample{Process: mk, TID: 500, Count: 300, Locations: stack("_start", "main", "run")},
	)
	for i := range 247 {
		name := "compile"
		switch {
		case i == 100:
			name = hostileName
		case i%5 == 4:
			name = "sh"
		}
		pr := &trace.Process{PID: uint32(11000 + 37*i), Name: name}
		p.Samples = append(p.Samples, &trace.Sample{Process: pr, TID: pr.PID, Count: int64(1 + i%3), Locations: stack("_start", "main", "work")})
	}
	for _, l := range locs {
		p.Locations = append(p.Locations, l)
	}
	return p
}

const windowJS = `({scrollY: window.scrollY, innerHeight: window.innerHeight, innerWidth: window.innerWidth,
	toolbar: document.getElementById("toolbar").getBoundingClientRect().bottom,
	graphHeight: document.getElementById("frames").getBoundingClientRect().height})`

type windowState struct {
	ScrollY     float64 `json:"scrollY"`
	InnerHeight float64 `json:"innerHeight"`
	InnerWidth  float64 `json:"innerWidth"`
	Toolbar     float64 `json:"toolbar"` // the sticky toolbar's bottom edge
	GraphHeight float64 `json:"graphHeight"`
}

// inView tells whether a frame is wholly in the window and not under the toolbar.
func (w windowState) inView(f drawnFrame) bool {
	return f.Shown && f.Top >= w.Toolbar-0.5 && f.Bottom <= w.InnerHeight+0.5
}

// widest is the widest drawn frame of a name: of the frames of one name, one a
// process, the busiest process's.
func widest(frames []drawnFrame, name string) (drawnFrame, bool) {
	var best drawnFrame
	var ok bool
	for _, f := range frames {
		if strings.HasPrefix(f.Text, name+" (") && (!ok || f.Width > best.Width) {
			best, ok = f, true
		}
	}
	return best, ok
}

// waitFor polls the page until expr is true.
func waitFor(what, expr string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		if err := chromedp.Poll(expr, nil, chromedp.WithPollingTimeout(10*time.Second)).Do(ctx); err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		return nil
	})
}

// TestFlameHTMLDeepHostInBrowser opens the page of a busy host, stacks 300 frames deep
// and 250 processes, in a 1400x1000 window as a new user would: the graph's roots are
// on the first screen without scrolling, the processes take one line until opened, and
// the flame layout, when chosen, brings the roots into view and keeps them there.
func TestFlameHTMLDeepHostInBrowser(t *testing.T) {
	ctx := startBrowser(t)
	page := filepath.Join(t.TempDir(), "deep.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	p := deepProfile()
	facts := flame.FactsFrom(p)
	facts.Host, facts.Version, facts.LostSamples = "buildhost", "v0-test", 0
	if len(facts.Processes) != 250 {
		t.Fatalf("the profile has %d processes, want 250", len(facts.Processes))
	}
	if err := flame.WriteHTML(f, p, facts); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	var win windowState
	var frames []drawnFrame
	var layout string
	var screen []byte
	err = chromedp.Run(ctx,
		chromedp.EmulateViewport(1400, 1000),
		chromedp.Navigate(fileURL(page)),
		waitFor("the page", `window.sondeFlame && window.sondeFlame.ready`),
		chromedp.Evaluate(windowJS, &win),
		chromedp.Evaluate(`window.sondeFlame.layout()`, &layout),
		chromedp.Evaluate(drawnFramesJS, &frames),
		chromedp.CaptureScreenshot(&screen),
	)
	if err != nil {
		t.Fatal(err)
	}
	if win.InnerWidth != 1400 || win.InnerHeight != 1000 {
		t.Fatalf("the window is %.0fx%.0f, want 1400x1000", win.InnerWidth, win.InnerHeight)
	}
	if err := os.WriteFile(filepath.Join(artifactDir(t), "flame-html-deep.png"), screen, 0o644); err != nil {
		t.Fatal(err)
	}

	// The roots are on the first screen: the all bar, every process's outermost
	// frames and the deep process's, though the graph is five times the window's height.
	if layout != "icicle" {
		t.Errorf("the page opens in the %s layout, want icicle", layout)
	}
	if win.GraphHeight < 300*17 {
		t.Errorf("the graph is %.0f px tall; 300 frames deep, it should be over %d", win.GraphHeight, 300*17)
	}
	if win.ScrollY != 0 {
		t.Errorf("the page opened scrolled to %.0f px", win.ScrollY)
	}
	for _, name := range []string{"all", "cc1plus-4242", "_start", "main", "step002"} {
		n := 0
		for _, fr := range frames {
			if !strings.HasPrefix(fr.Text, name+" (") {
				continue
			}
			n++
			if !win.inView(fr) {
				t.Errorf("frame %q spans %.0f to %.0f px; want it in the first screen, between the toolbar (%.0f px) and %.0f px",
					fr.Text, fr.Top, fr.Bottom, win.Toolbar, win.InnerHeight)
			}
		}
		if n == 0 {
			t.Errorf("no frame %q drawn", name)
		}
	}

	// The first screen shows the graph: its top half has many pixels of the frames'
	// colours, not blank page. (The page before the icicle layout had 0.2 %.)
	coloured, distinct, err := screenColours(screen, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the first screen's top half: %.1f%% coloured, %d colours", 100*coloured, distinct)
	if coloured < 0.05 || distinct < 40 {
		t.Errorf("the first screen's top half is %.1f%% coloured in %d colours; want over 5%% in 40 or more, a drawn graph", 100*coloured, distinct)
	}

	// The 250 processes are one line, their count and the busiest first.
	var box struct {
		Open    bool    `json:"open"`
		Hidden  bool    `json:"hidden"`
		Height  float64 `json:"height"`
		Line    float64 `json:"line"`
		Summary string  `json:"summary"`
		Count   string  `json:"count"`
		Listed  int     `json:"listed"`
		Img     bool    `json:"img"`
	}
	const boxJS = `(() => {
		const d = document.getElementById("processes"), s = d.querySelector("summary");
		return {open: d.open, hidden: d.hidden, height: d.getBoundingClientRect().height,
			line: parseFloat(getComputedStyle(s).lineHeight), summary: s.textContent,
			count: document.getElementById("processes-count").textContent,
			listed: document.querySelectorAll("#processes-list li").length,
			img: typeof pwned !== "undefined" || document.querySelector("header img") !== null};
	})()`
	if err := chromedp.Run(ctx, chromedp.Evaluate(boxJS, &box)); err != nil {
		t.Fatal(err)
	}
	if box.Hidden || box.Open || box.Height <= 0 || box.Height > 1.5*box.Line {
		t.Errorf("the process list is hidden %v, open %v, %.0f px tall; want it shown, folded, one %.0f px line", box.Hidden, box.Open, box.Height, box.Line)
	}
	busiest := fmt.Sprintf("250 processes: %s (%d), %s (%d), %s (%d), ", facts.Processes[0].Name, facts.Processes[0].PID,
		facts.Processes[1].Name, facts.Processes[1].PID, facts.Processes[2].Name, facts.Processes[2].PID)
	if box.Count != "250 processes" || !strings.HasPrefix(box.Summary, busiest) {
		t.Errorf("the folded process list reads %q (count %q), want 250 processes, the busiest first", box.Summary, box.Count)
	}
	if box.Listed != 250 {
		t.Errorf("%d processes listed, want 250", box.Listed)
	}
	if box.Img {
		t.Error("a process name ran as markup")
	}

	// Opened, the list shows every process; the filter narrows it by name or PID.
	const visibleJS = `Array.from(document.querySelectorAll("#processes-list li")).filter(li => li.getBoundingClientRect().height > 0).length`
	err = chromedp.Run(ctx,
		chromedp.Click(`#processes summary`, chromedp.ByQuery),
		waitFor("the process list to open", `document.getElementById("processes").open && `+visibleJS+` === 250`),
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"SH", "4242", "117", "<img", "no such process"} {
		want := 0
		for _, pr := range facts.Processes {
			if strings.Contains(strings.ToLower(pr.Name), strings.ToLower(q)) || strings.Contains(fmt.Sprint(pr.PID), q) {
				want++
			}
		}
		if want == 250 || want == 0 && q != "no such process" {
			t.Fatalf("filter %q: the test expects it to narrow the list to some, it matches %d", q, want)
		}
		wantShown := fmt.Sprintf("%d of 250 listed", want)
		if want == 0 {
			wantShown = "no process matches"
		}
		err := chromedp.Run(ctx,
			chromedp.Evaluate(`document.getElementById("processes-filter").value = ""`, nil),
			chromedp.SendKeys(`#processes-filter`, q, chromedp.ByQuery),
		)
		if err != nil {
			t.Fatal(err)
		}
		// A wrong count shows after the wait, which then only costs time.
		_ = chromedp.Run(ctx, waitFor("the filter "+q, fmt.Sprintf(`%s === %d && document.getElementById("processes-shown").textContent === %q`, visibleJS, want, wantShown)))
		var got int
		var shown string
		err = chromedp.Run(ctx,
			chromedp.Evaluate(visibleJS, &got),
			chromedp.Evaluate(`document.getElementById("processes-shown").textContent`, &shown),
		)
		if err != nil {
			t.Fatal(err)
		}
		if got != want || shown != wantShown {
			t.Errorf("filter %q shows %d processes and says %q, want %d and %q", q, got, shown, want, wantShown)
		}
	}
	var cc string
	err = chromedp.Run(ctx,
		chromedp.Evaluate(`document.getElementById("processes-filter").value = ""`, nil),
		chromedp.SendKeys(`#processes-filter`, "cc1", chromedp.ByQuery),
		waitFor("the filter cc1", visibleJS+` === 1`),
		chromedp.Evaluate(`Array.from(document.querySelectorAll("#processes-list li")).find(li => !li.hidden).textContent`, &cc),
		// Escape clears the filter, and only that.
		chromedp.KeyEvent(kb.Escape),
		waitFor("Escape to clear the filter and keep the list open",
			`document.getElementById("processes-filter").value === "" && document.getElementById("processes").open && `+visibleJS+` === 250`),
		chromedp.Click(`#processes summary`, chromedp.ByQuery),
		waitFor("the process list to fold", `!document.getElementById("processes").open`),
		chromedp.Evaluate(`window.scrollTo(0, 0)`, nil),
	)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("cc1plus (4242) %.2f%%", 100*40/float64(facts.Samples)); cc != want {
		t.Errorf("the cc1plus entry reads %q, want %q", cc, want)
	}

	// The flame layout: the page scrolls to the roots at the graph's bottom.
	err = chromedp.Run(ctx,
		chromedp.Click(`#flame`, chromedp.ByQuery),
		waitFor("the flame layout", `window.sondeFlame.layout() === "flame"`),
		chromedp.Evaluate(windowJS, &win),
		chromedp.Evaluate(drawnFramesJS, &frames),
	)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := widest(frames, "all")
	start, _ := widest(frames, "_start")
	if win.ScrollY < 1000 || !win.inView(root) || !win.inView(start) || !(start.Top < root.Top) {
		t.Fatalf("flame layout: scrolled to %.0f px, all at %.0f px, _start at %.0f px, window %.0f px; want the roots in view, all at the bottom",
			win.ScrollY, root.Top, start.Top, win.InnerHeight)
	}

	// Hover and zoom work there. Zooming into make, three frames deep, shrinks the
	// graph; zooming out grows it back by 300 rows above the roots, which stay in view.
	var tipText string
	err = chromedp.Run(ctx,
		chromedp.ActionFunc(func(ctx context.Context) error {
			return input.DispatchMouseEvent(input.MouseMoved, root.Left+root.Width/2, root.Top+5).Do(ctx)
		}),
		waitFor("the tooltip", `!document.getElementById("tooltip").hidden`),
		chromedp.Text(`#tooltip`, &tipText, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d samples, 100.00%% of all", facts.Samples); !strings.Contains(tipText, want) {
		t.Errorf("flame layout: the root's tooltip %q lacks %q", tipText, want)
	}
	mk, ok := widest(frames, "make-500")
	if !ok || !win.inView(mk) {
		t.Fatalf("flame layout: make-500 is %+v, want it drawn in view", mk)
	}
	err = chromedp.Run(ctx,
		chromedp.MouseClickXY(mk.Left+mk.Width/2, mk.Top+8),
		waitFor("the zoom into make-500", fmt.Sprintf(`String(window.sondeFlame.zoomed()) === %q`, mk.ID)),
		chromedp.Evaluate(windowJS, &win),
		chromedp.Evaluate(drawnFramesJS, &frames),
	)
	if err != nil {
		t.Fatal(err)
	}
	zoomedMk, _ := widest(frames, "make-500")
	run, _ := widest(frames, "run")
	if win.GraphHeight > 6*18 || !win.inView(zoomedMk) || !win.inView(run) || !(run.Top < zoomedMk.Top) {
		t.Errorf("flame layout, zoomed into make-500: graph %.0f px tall, make-500 %+v, run %+v; want 5 rows, both in view, run above",
			win.GraphHeight, zoomedMk, run)
	}
	err = chromedp.Run(ctx,
		chromedp.Click(`#reset`, chromedp.ByQuery),
		waitFor("the zoom out", `window.sondeFlame.zoomed() === 0`),
		chromedp.Evaluate(windowJS, &win),
		chromedp.Evaluate(drawnFramesJS, &frames),
	)
	if err != nil {
		t.Fatal(err)
	}
	root, _ = widest(frames, "all")
	if win.GraphHeight < 300*17 || !win.inView(root) {
		t.Errorf("flame layout, zoomed out: graph %.0f px tall, all spans %.0f to %.0f px, window %.0f px; want the roots still in view",
			win.GraphHeight, root.Top, root.Bottom, win.InnerHeight)
	}

	// Back to the icicle layout: the page scrolls up to the roots.
	err = chromedp.Run(ctx,
		chromedp.Click(`#icicle`, chromedp.ByQuery),
		waitFor("the icicle layout", `window.sondeFlame.layout() === "icicle"`),
		chromedp.Evaluate(windowJS, &win),
		chromedp.Evaluate(drawnFramesJS, &frames),
	)
	if err != nil {
		t.Fatal(err)
	}
	root, _ = widest(frames, "all")
	start, _ = widest(frames, "_start")
	if !win.inView(root) || !win.inView(start) || !(root.Top < start.Top) {
		t.Errorf("icicle layout again: all at %.0f px, _start at %.0f px, window %.0f px; want both in view, all on top", root.Top, start.Top, win.InnerHeight)
	}
}

// screenColours reads a PNG screenshot and tells, of the pixels in its top part (the
// fraction top of its height), the share that are clearly coloured (as frames are, not
// the page's greys and text) and how many distinct colours there are.
func screenColours(data []byte, top float64) (coloured float64, distinct int, err error) {
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return 0, 0, fmt.Errorf("decode screenshot: %w", err)
	}
	b := img.Bounds()
	rows := int(float64(b.Dy()) * top)
	colours := map[[3]uint32]bool{}
	n := 0
	for y := b.Min.Y; y < b.Min.Y+rows; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			r, g, bl = r>>8, g>>8, bl>>8
			colours[[3]uint32{r, g, bl}] = true
			if max(r, g, bl)-min(r, g, bl) > 48 {
				n++
			}
		}
	}
	if rows*b.Dx() == 0 {
		return 0, 0, fmt.Errorf("screenshot of %v px", b)
	}
	return float64(n) / float64(rows*b.Dx()), len(colours), nil
}

func TestFlameSVGInBrowser(t *testing.T) {
	ctx := startBrowser(t)
	path := filepath.Join(t.TempDir(), "flame.svg")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	p := flameProfile()
	if err := flame.WriteSVG(f, p, flame.FactsFrom(p)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var before, after, flipped []svgFrame
	var matched, button string
	err = chromedp.Run(ctx,
		chromedp.Navigate(fileURL(path)),
		chromedp.Poll(`window.sondeFlame && window.sondeFlame.ready`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Evaluate(svgFramesJS, &before),
		// A real click on alpha's rectangle.
		chromedp.Click(`//*[local-name()="g"][*[local-name()="title" and starts-with(., "alpha")]]/*[local-name()="rect"]`, chromedp.BySearch),
		chromedp.Evaluate(svgFramesJS, &after),
		chromedp.Evaluate(`window.sondeFlame.search("eta"), document.getElementById("matched").textContent`, &matched),
		// The flame layout keeps the zoom.
		chromedp.Click(`#layout`, chromedp.ByQuery),
		waitFor("the flame layout", `window.sondeFlame.layout() === "flame"`),
		chromedp.Evaluate(svgFramesJS, &flipped),
		chromedp.Evaluate(`document.getElementById("layout").textContent`, &button),
	)
	if err != nil {
		t.Fatal(err)
	}
	width := map[string]float64{}
	for _, fr := range before {
		width[fr.Name] = fr.Width
	}
	for name := range flameWant {
		if width[name] <= 0 {
			t.Errorf("frame %q not drawn in the SVG", name)
		}
	}
	checkSVGRows(t, "icicle", before, 16)
	full := width["all"]
	for _, fr := range after {
		switch fr.Name {
		case "alpha":
			if !fr.Shown || !near(fr.Width, full) {
				t.Errorf("after the click alpha is %.1f px wide, want %.1f", fr.Width, full)
			}
		case hostileName:
			if fr.Shown {
				t.Error("a frame outside the zoomed one is still shown")
			}
		}
	}
	if want := "Matched: 45.00% (90 of 200 samples)"; matched != want {
		t.Errorf("SVG search shows %q, want %q", matched, want)
	}
	checkSVGRows(t, "flame", flipped, -16)
	for _, fr := range flipped {
		if fr.Name == "alpha" && (!fr.Shown || !near(fr.Width, full)) {
			t.Errorf("flame layout: alpha is %.1f px wide, want %.1f, still zoomed", fr.Width, full)
		}
	}
	if button != "Icicle layout" {
		t.Errorf("in the flame layout the button reads %q, want Icicle layout", button)
	}
}

type svgFrame struct {
	Name   string  `json:"name"`
	Top    float64 `json:"top"`
	Bottom float64 `json:"bottom"`
	Width  float64 `json:"width"`
	Shown  bool    `json:"shown"`
}

const svgFramesJS = `Array.from(document.querySelectorAll("#frames > g.f")).map(g => {
	const r = g.querySelector("rect").getBoundingClientRect();
	return {name: g.querySelector("title").textContent.split("\n")[0], top: r.top, bottom: r.bottom, width: r.width,
		shown: g.getAttribute("display") !== "none"};
})`

// checkSVGRows checks that callers of flameProfile's SVG are row px above their
// callees (negative: below).
func checkSVGRows(t *testing.T, layout string, frames []svgFrame, row float64) {
	t.Helper()
	top := map[string]float64{}
	for _, fr := range frames {
		top[fr.Name] = fr.Top
	}
	for _, pair := range [][2]string{{"all", "app-42"}, {"app-42", "main"}, {"main", "alpha"}, {"beta", "gamma"}} {
		if !near(top[pair[1]]-top[pair[0]], row) {
			t.Errorf("SVG, %s layout: %s at %.0f px, its callee %s at %.0f px; want the callee %+.0f px from it", layout, pair[0], top[pair[0]], pair[1], top[pair[1]], row)
		}
	}
}

// TestFlameSVGDeepInBrowser: the SVG of a host with stacks 300 frames deep shows its
// roots on the first screen, and the flame layout scrolls down to them.
func TestFlameSVGDeepInBrowser(t *testing.T) {
	ctx := startBrowser(t)
	path := filepath.Join(t.TempDir(), "deep.svg")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	p := deepProfile()
	if err := flame.WriteSVG(f, p, flame.FactsFrom(p)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	type view struct {
		ScrollY     float64 `json:"scrollY"`
		InnerHeight float64 `json:"innerHeight"`
		Height      float64 `json:"height"`
	}
	const viewJS = `({scrollY: window.scrollY, innerHeight: window.innerHeight, height: document.documentElement.getBoundingClientRect().height})`
	// roots finds the all frame and the widest _start.
	roots := func(frames []svgFrame) (all, start svgFrame) {
		for _, fr := range frames {
			switch {
			case fr.Name == "all":
				all = fr
			case fr.Name == "_start" && fr.Width > start.Width:
				start = fr
			}
		}
		return all, start
	}
	inView := func(v view, fr svgFrame) bool { return fr.Shown && fr.Top >= 0 && fr.Bottom <= v.InnerHeight }
	for i, layout := range []string{"icicle", "flame", "icicle"} {
		var v view
		var frames []svgFrame
		var actions []chromedp.Action
		if i == 0 {
			actions = append(actions,
				chromedp.EmulateViewport(1400, 1000),
				chromedp.Navigate(fileURL(path)),
				waitFor("the SVG", `window.sondeFlame && window.sondeFlame.ready`))
		} else {
			actions = append(actions,
				chromedp.Click(`#layout`, chromedp.ByQuery),
				waitFor("the "+layout+" layout", fmt.Sprintf(`window.sondeFlame.layout() === %q`, layout)))
		}
		actions = append(actions, chromedp.Evaluate(viewJS, &v), chromedp.Evaluate(svgFramesJS, &frames))
		if err := chromedp.Run(ctx, actions...); err != nil {
			t.Fatal(err)
		}
		if v.Height < 300*16 {
			t.Fatalf("the SVG is %.0f px tall; 300 frames deep, it should be over %d", v.Height, 300*16)
		}
		all, start := roots(frames)
		if !inView(v, all) || !inView(v, start) || (layout == "icicle") != (all.Top < start.Top) {
			t.Errorf("SVG, %s layout, scrolled to %.0f px: all at %.0f px, _start at %.0f px; want both in the %.0f px window, all %s",
				layout, v.ScrollY, all.Top, start.Top, v.InnerHeight, map[bool]string{true: "above", false: "below"}[layout == "icicle"])
		}
		if i == 0 && v.ScrollY != 0 || layout == "flame" && v.ScrollY < 1000 {
			t.Errorf("SVG, %s layout: scrolled to %.0f px, want %s", layout, v.ScrollY, map[bool]string{true: "0 when opened", false: "down to the roots"}[i == 0])
		}
	}
}

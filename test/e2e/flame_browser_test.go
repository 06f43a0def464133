package e2e

// The flame graph page and SVG of reporter/flame in a real browser: Debian's chromium,
// headless, driven over the DevTools protocol. The pages are opened from file:// URLs,
// so they cannot have needed the network.

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"

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
	Width   float64 `json:"width"`
	Clipped bool    `json:"clipped"`
	Shown   bool    `json:"shown"`
	Match   bool    `json:"match"`
}

// drawnFramesJS lists the frames the page drew, as the layout engine placed them.
const drawnFramesJS = `Array.from(document.querySelectorAll("#frames .frame")).map(e => {
	const r = e.getBoundingClientRect(), s = getComputedStyle(e);
	return {id: e.getAttribute("data-id") || "", text: e.textContent, left: r.left, top: r.top, width: r.width,
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

	var graphWidth, graphLeft float64
	var frames []drawnFrame
	var factsText, topText string
	var pwned bool
	err = chromedp.Run(ctx,
		chromedp.Navigate(fileURL(page)),
		chromedp.Poll(`window.sondeFlame && window.sondeFlame.ready`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Evaluate(`document.getElementById("frames").getBoundingClientRect().width`, &graphWidth),
		chromedp.Evaluate(`document.getElementById("frames").getBoundingClientRect().left`, &graphLeft),
		chromedp.Evaluate(drawnFramesJS, &frames),
		chromedp.Text(`#facts`, &factsText, chromedp.ByQuery),
		chromedp.Text(`#top tbody`, &topText, chromedp.ByQuery),
		chromedp.Evaluate(`typeof pwned !== "undefined" || document.querySelector("#frames img, #top img") !== null`, &pwned),
	)
	if err != nil {
		t.Fatal(err)
	}
	if graphWidth < 800 {
		t.Fatalf("the graph is %.0f px wide; the window should give it more", graphWidth)
	}

	// Every function is drawn, labelled in full with its share, as wide as its share.
	drawn := byLabel(frames)
	for name, share := range flameWant {
		fr, ok := drawn[label(name)]
		if !ok {
			t.Errorf("no frame labelled %q among %d drawn", label(name), len(frames))
			continue
		}
		var pct float64
		fmt.Sscanf(share, "%f%%", &pct)
		if !fr.Shown || fr.Clipped || !near(fr.Width, graphWidth*pct/100) {
			t.Errorf("%s: shown %v, label clipped %v, %.1f px wide; want shown, whole and %.1f px", name, fr.Shown, fr.Clipped, fr.Width, graphWidth*pct/100)
		}
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
			t.Errorf("tooltip %q lacks %q", tipText, want)
		}
	}

	// Click alpha: it now spans the graph, beta scales with it, epsilon's sibling
	// subtree is gone.
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
		t.Errorf("after the click alpha is %+v; want it across the %.0f px graph", fr, graphWidth)
	}
	if fr := drawn[label("beta")]; !near(fr.Width, graphWidth*60/100) {
		t.Errorf("after the zoom beta is %.1f px wide, want %.1f (60/100 of alpha)", fr.Width, graphWidth*0.6)
	}
	if _, ok := drawn[label(hostileName)]; ok {
		t.Error("a frame outside the zoomed one is still drawn")
	}
	if fmt.Sprint(zoomed) != alpha.ID {
		t.Errorf("the page says it zoomed to node %d, want %s", zoomed, alpha.ID)
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
		t.Errorf("search shows %q, want %q", matchText, want)
	}
	var matched []string
	for _, fr := range frames {
		if fr.Match {
			matched = append(matched, fr.Text)
		}
		if fr.Text == label("all") && !near(fr.Width, graphWidth) {
			t.Errorf("after the reset the root is %.1f px wide, want %.0f", fr.Width, graphWidth)
		}
	}
	if len(matched) != 3 {
		t.Errorf("highlighted %v, want beta, zeta and eta", matched)
	}

	shot := filepath.Join(artifactDir(t), "flame-html.png")
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)

	// The icicle layout puts the root on top.
	var rootTop, mainTop float64
	err = chromedp.Run(ctx,
		chromedp.Click(`#icicle`, chromedp.ByQuery),
		chromedp.Evaluate(drawnFramesJS, &frames),
	)
	if err != nil {
		t.Fatal(err)
	}
	drawn = byLabel(frames)
	rootTop, mainTop = drawn[label("all")].Top, drawn[label("main")].Top
	if !(rootTop < mainTop) {
		t.Errorf("icicle: root at %.0f px, main at %.0f px; want the root above", rootTop, mainTop)
	}
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
	type svgFrame struct {
		Name  string  `json:"name"`
		Width float64 `json:"width"`
		Shown bool    `json:"shown"`
	}
	const framesJS = `Array.from(document.querySelectorAll("#frames > g.f")).map(g => ({
		name: g.querySelector("title").textContent.split("\n")[0],
		width: g.querySelector("rect").getBoundingClientRect().width,
		shown: g.getAttribute("display") !== "none"}))`
	var before, after []svgFrame
	var matched string
	err = chromedp.Run(ctx,
		chromedp.Navigate(fileURL(path)),
		chromedp.Poll(`window.sondeFlame && window.sondeFlame.ready`, nil, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.Evaluate(framesJS, &before),
		// A real click on alpha's rectangle.
		chromedp.Click(`//*[local-name()="g"][*[local-name()="title" and starts-with(., "alpha")]]/*[local-name()="rect"]`, chromedp.BySearch),
		chromedp.Evaluate(framesJS, &after),
		chromedp.Evaluate(`window.sondeFlame.search("eta"), document.getElementById("matched").textContent`, &matched),
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
}

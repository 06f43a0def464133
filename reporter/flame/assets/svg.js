// The script of sonde's SVG flame graphs (reporter/flame/svg.go): zoom, search and
// details. Names are read from and written to text nodes only, never as markup.
(function () {
  "use strict";
  var svg = document.documentElement;
  var PAD = 10, CHAR_W = 7.2;
  var width = +svg.getAttribute("width");
  var total = +svg.getAttribute("data-total");
  var depth = +svg.getAttribute("data-depth");
  var top = +svg.getAttribute("data-frames-top"), frameH = +svg.getAttribute("data-frame-height");
  var details = document.getElementById("details");
  var matchedEl = document.getElementById("matched");
  var resetEl = document.getElementById("reset");
  var searchEl = document.getElementById("search");
  var layoutEl = document.getElementById("layout");

  var frames = Array.prototype.map.call(document.querySelectorAll("#frames > g"), function (g) {
    var title = g.getElementsByTagName("title")[0];
    return {
      g: g,
      rect: g.getElementsByTagName("rect")[0],
      text: g.getElementsByTagName("text")[0] || null,
      x: +g.getAttribute("data-x"),
      w: +g.getAttribute("data-w"),
      d: +g.getAttribute("data-d"),
      merged: g.getAttribute("class") === "m",
      name: title.textContent.split("\n")[0]
    };
  });
  var byG = new Map();
  frames.forEach(function (f) { byG.set(f.g, f); });

  function pct(v) {
    return (total > 0 ? (100 * v / total).toFixed(2) : "0.00") + "%";
  }

  function fit(label, w) {
    var n = Math.floor((w - 6) / CHAR_W);
    if (n < 3) return "";
    return label.length <= n ? label : label.slice(0, n - 2) + "..";
  }

  var zoomed = null, flame = false;

  // setLayout turns the graph over: svg.go draws an icicle, roots on top; the flame
  // layout puts them at the bottom, and the view scrolls down to them, since that is
  // where a reader starts.
  function setLayout(toFlame) {
    flame = toFlame;
    frames.forEach(function (o) {
      var y = top + (flame ? depth - o.d : o.d) * frameH;
      o.rect.setAttribute("y", y.toFixed(2));
      if (o.text) o.text.setAttribute("y", (y + frameH - 4.5).toFixed(2));
    });
    layoutEl.textContent = flame ? "Icicle layout" : "Flame layout";
    var root = frames.length ? frames[0].rect.getBoundingClientRect() : null; // svg.go writes the root first
    if (!root) return;
    if (root.bottom > window.innerHeight) {
      window.scrollBy(0, root.bottom - window.innerHeight + 8);
    } else if (root.top < 0) {
      window.scrollBy(0, root.top - 8);
    }
  }

  // zoom lays the frames out so that f spans the full width: its ancestors (the
  // frames nearer the root whose span holds its own) stretch faded across, its descendants
  // scale up, the rest hide.
  function zoom(f) {
    zoomed = f && f.d > 0 ? f : null;
    var zx = zoomed ? zoomed.x : 0, zw = zoomed ? zoomed.w : total, zd = zoomed ? zoomed.d : 0;
    var scale = (width - 2 * PAD) / zw;
    frames.forEach(function (o) {
      var x, w, anc = false;
      if (o.d < zd && o.x <= zx && o.x + o.w >= zx + zw) {
        x = PAD;
        w = width - 2 * PAD;
        anc = true;
      } else if (o.d >= zd && o.x >= zx && o.x + o.w <= zx + zw) {
        x = PAD + (o.x - zx) * scale;
        w = o.w * scale;
      } else {
        o.g.setAttribute("display", "none");
        return;
      }
      o.g.removeAttribute("display");
      o.rect.setAttribute("x", x.toFixed(2));
      o.rect.setAttribute("width", w.toFixed(2));
      var cls = o.merged ? "m" : "f";
      if (anc) cls += " anc";
      if (o.hit) cls += " hit";
      o.g.setAttribute("class", cls);
      if (o.text) {
        o.text.setAttribute("x", (x + 3).toFixed(2));
        o.text.textContent = fit(o.name + " (" + pct(o.w) + ")", w);
      }
    });
    resetEl.setAttribute("visibility", zoomed ? "visible" : "hidden");
  }

  // search marks the frames whose name matches and sums the samples under them,
  // counting a stretch of the x axis once however many nested matches cover it.
  function search(term) {
    var re = null;
    if (term) {
      try {
        re = new RegExp(term);
      } catch (e) {
        matchedEl.textContent = "invalid regular expression";
        return;
      }
    }
    var spans = [];
    frames.forEach(function (o) {
      o.hit = !o.merged && o.d > 0 && re !== null && re.test(o.name);
      if (o.hit) spans.push([o.x, o.x + o.w]);
    });
    spans.sort(function (a, b) { return a[0] - b[0]; });
    var sum = 0, end = -1;
    spans.forEach(function (s) {
      if (s[1] <= end) return;
      sum += s[1] - Math.max(s[0], end);
      end = s[1];
    });
    matchedEl.textContent = re ? "Matched: " + pct(sum) + " (" + sum + " of " + total + " samples)" : " ";
    searchEl.textContent = re ? "Reset search" : "Search";
    svg.setAttribute("data-matched", re ? sum : "");
    zoom(zoomed);
  }

  document.getElementById("frames").addEventListener("click", function (e) {
    var f = byG.get(e.target.parentNode);
    if (!f || f.merged) return;
    zoom(f === zoomed ? null : f);
  });
  document.getElementById("frames").addEventListener("mouseover", function (e) {
    var f = byG.get(e.target.parentNode);
    if (!f) return;
    details.textContent = f.merged
      ? "frames too narrow to draw: " + f.w + " samples, " + pct(f.w)
      : f.name + ": " + f.w + " samples, " + pct(f.w);
  });
  document.getElementById("frames").addEventListener("mouseout", function () {
    details.textContent = " ";
  });
  resetEl.addEventListener("click", function () { zoom(null); });
  layoutEl.addEventListener("click", function () { setLayout(!flame); });
  searchEl.addEventListener("click", function () {
    if (searchEl.textContent !== "Search") {
      search("");
      return;
    }
    var term = window.prompt("Search functions (regular expression)", "");
    if (term) search(term);
  });
  document.addEventListener("keydown", function (e) {
    if (e.key === "Escape") zoom(null);
  });

  // For tests: the same operations without a prompt.
  window.sondeFlame = {
    ready: true,
    search: search,
    zoom: function (i) { zoom(frames[i] || null); },
    layout: function () { return flame ? "flame" : "icicle"; }
  };
})();

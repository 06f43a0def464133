// The flame graph page of sonde (reporter/flame). It lays out the call tree that the
// page carries as JSON and draws the frames wide enough to see as positioned elements.
// Profile strings reach the document only through textContent, never as markup.
(function () {
  "use strict";

  var FRAME_H = 18; // px per stack level
  var MIN_W = 1; // px: narrower frames are drawn merged with their narrow siblings
  var LABEL_MIN_W = 22; // px: below this a label would be all ellipsis
  var FIELDS = 7; // numbers per node in data.nodes, see reporter/flame/html.go

  var data = JSON.parse(document.getElementById("sonde-data").textContent);
  var strs = data.strings, kinds = data.kinds, raw = data.nodes;
  var n = Math.floor(raw.length / FIELDS);

  // The tree in flat arrays, preorder: a node's descendants are the nodes after it up
  // to endOf[node], so a subtree is skipped in one step. xOf is a node's left edge in
  // samples from the root's.
  var nameOf = new Int32Array(n), fileOf = new Int32Array(n), lineOf = new Float64Array(n),
    kindOf = new Uint8Array(n), selfOf = new Float64Array(n), totalOf = new Float64Array(n),
    depthOf = new Int32Array(n), parentOf = new Int32Array(n), xOf = new Float64Array(n),
    endOf = new Int32Array(n);
  (function () {
    var stack = [], next = new Float64Array(n);
    for (var i = 0; i < n; i++) {
      var o = i * FIELDS;
      nameOf[i] = raw[o]; fileOf[i] = raw[o + 1]; lineOf[i] = raw[o + 2]; kindOf[i] = raw[o + 3];
      selfOf[i] = raw[o + 4]; totalOf[i] = raw[o + 5]; depthOf[i] = raw[o + 6];
      while (stack.length > depthOf[i]) endOf[stack.pop()] = i;
      var p = stack.length ? stack[stack.length - 1] : -1;
      parentOf[i] = p;
      xOf[i] = p < 0 ? 0 : next[p];
      if (p >= 0) next[p] += totalOf[i];
      next[i] = xOf[i];
      stack.push(i);
    }
    while (stack.length) endOf[stack.pop()] = n;
  })();
  var all = n ? totalOf[0] : 0;

  function pct(v, of) {
    return (of > 0 ? (100 * v / of).toFixed(2) : "0.00") + "%";
  }

  // Colours tell frame kinds apart and vary with the name, so neighbours differ and a
  // function keeps its colour between pages.
  function hash(s) {
    var h = 2166136261;
    for (var i = 0; i < s.length; i++) {
      h ^= s.charCodeAt(i);
      h = Math.imul(h, 16777619);
    }
    return (h >>> 0) / 4294967296;
  }
  var colours = [];
  function colour(i) {
    var c = colours[nameOf[i] * kinds.length + kindOf[i]];
    if (c) return c;
    var v = hash(strs[nameOf[i]]);
    switch (i === 0 ? "root" : kinds[kindOf[i]]) {
      case "root": c = "hsl(0,0%,80%)"; break;
      case "process": c = "hsl(220,14%," + (74 + 8 * v).toFixed(1) + "%)"; break;
      case "kernel": c = "hsl(" + (22 + 14 * v).toFixed(1) + ",80%," + (60 + 8 * v).toFixed(1) + "%)"; break;
      case "go": c = "hsl(" + (180 + 25 * v).toFixed(1) + ",55%," + (62 + 10 * v).toFixed(1) + "%)"; break;
      case "":
      case "native": c = "hsl(" + (2 + 52 * v).toFixed(1) + ",82%," + (62 + 8 * v).toFixed(1) + "%)"; break;
      // A language runtime's frames: greens and teals, a hue of its own by its name.
      default: c = "hsl(" + (70 + 80 * hash(kinds[kindOf[i]]) + 30 * v).toFixed(1) + ",50%," + (60 + 10 * v).toFixed(1) + "%)";
    }
    colours[nameOf[i] * kinds.length + kindOf[i]] = c;
    return c;
  }

  var framesEl = document.getElementById("frames");
  var tip = document.getElementById("tooltip");
  var searchEl = document.getElementById("search");
  var regexEl = document.getElementById("regex");
  var matchEl = document.getElementById("match");
  var icicleEl = document.getElementById("icicle");
  var flameEl = document.getElementById("flame");
  var toolbarEl = document.getElementById("toolbar");
  var resetEl = document.getElementById("reset");

  // The icicle layout is the default: its roots sit at the graph's top, on the first
  // screen however deep the host's deepest stack, where a flame graph's roots would be
  // thousands of pixels down.
  var zoom = 0, icicle = true;
  var matched = new Uint8Array(n), matchedSamples = 0;

  function frameBox(i, left, width, extra) {
    var el = document.createElement("div");
    el.className = "frame" + extra + (matched[i] ? " match" : "");
    el.style.left = left + "px";
    el.style.width = width + "px";
    el.style.background = colour(i);
    el.setAttribute("data-id", i);
    if (width >= LABEL_MIN_W) el.textContent = strs[nameOf[i]] + " (" + pct(totalOf[i], all) + ")";
    return el;
  }

  function mergedBox(left, width, count, samples) {
    var el = document.createElement("div");
    el.className = "frame merged";
    el.style.left = left + "px";
    el.style.width = width + "px";
    el.setAttribute("data-merged", count);
    el.setAttribute("data-samples", samples);
    return el;
  }

  // render draws the zoomed frame across the full width, its ancestors faded above it
  // (below it in the flame layout) and its descendants to scale. Frames narrower than
  // MIN_W are not drawn, nor their descendants: each run of them becomes one hatched
  // box, so a graph of a hundred thousand nodes draws a few thousand elements. The
  // graph is as tall as the deepest frame drawn, not the deepest in the tree: a deep
  // stack too narrow to see leaves no empty band.
  function render() {
    // In the flame layout a change of height moves every frame, the roots included;
    // the page scrolls by as much, so that what was under the pointer stays there.
    var bottom = icicle ? 0 : framesEl.getBoundingClientRect().bottom;
    framesEl.textContent = "";
    if (all <= 0) {
      document.getElementById("empty").hidden = false;
      framesEl.style.height = "0";
      return;
    }
    var width = framesEl.clientWidth;
    var zx = xOf[zoom], scale = width / totalOf[zoom];
    var boxes = [], depths = [], deepest = 0;
    function add(el, depth) {
      boxes.push(el);
      depths.push(depth);
      if (depth > deepest) deepest = depth;
    }
    for (var a = parentOf[zoom]; a >= 0; a = parentOf[a]) add(frameBox(a, 0, width, " ancestor"), depthOf[a]);
    var end = endOf[zoom], i = zoom;
    while (i < end) {
      var w = totalOf[i] * scale;
      if (w >= MIN_W || i === zoom) {
        add(frameBox(i, (xOf[i] - zx) * scale, w, ""), depthOf[i]);
        i++;
        continue;
      }
      var pend = endOf[parentOf[i]], sum = 0, count = 0, j = i;
      while (j < pend && totalOf[j] * scale < MIN_W) {
        sum += totalOf[j];
        count++;
        j = endOf[j];
      }
      if (sum * scale >= MIN_W) add(mergedBox((xOf[i] - zx) * scale, sum * scale, count, sum), depthOf[i]);
      i = j;
    }
    var frag = document.createDocumentFragment();
    for (var k = 0; k < boxes.length; k++) {
      boxes[k].style.top = (icicle ? depths[k] : deepest - depths[k]) * FRAME_H + "px";
      frag.appendChild(boxes[k]);
    }
    framesEl.style.height = (deepest + 1) * FRAME_H + "px";
    framesEl.appendChild(frag);
    if (!icicle) {
      var moved = framesEl.getBoundingClientRect().bottom - bottom;
      if (moved) window.scrollBy(0, moved);
    }
  }

  // showRoots scrolls the least that brings the graph's root row into the window, below
  // the toolbar that stays on top; a page whose graph is in view does not move.
  function showRoots() {
    if (!framesEl.firstChild) return;
    var r = framesEl.getBoundingClientRect(), bar = toolbarEl.getBoundingClientRect().bottom;
    var rowTop = icicle ? r.top : r.bottom - FRAME_H, rowBottom = rowTop + FRAME_H;
    if (rowTop < bar) {
      window.scrollBy(0, rowTop - bar - 8);
    } else if (rowBottom > window.innerHeight) {
      window.scrollBy(0, rowBottom - window.innerHeight + 8);
    }
  }

  function setLayout() {
    icicle = icicleEl.checked;
    tip.hidden = true;
    render();
    showRoots();
  }

  function zoomTo(i) {
    zoom = i;
    resetEl.disabled = i === 0;
    tip.hidden = true;
    render();
  }

  function line(text, cls) {
    var d = document.createElement("div");
    if (cls) d.className = cls;
    d.textContent = text;
    tip.appendChild(d);
  }

  function fillTip(el) {
    tip.textContent = "";
    if (el.classList.contains("merged")) {
      var s = +el.getAttribute("data-samples");
      line(el.getAttribute("data-merged") + " frames too narrow to draw", "fn");
      line(s + " samples, " + pct(s, all) + " of all");
      line("zoom into their caller to see them", "dim");
      return;
    }
    var i = +el.getAttribute("data-id");
    line(strs[nameOf[i]], "fn");
    if (fileOf[i]) line(strs[fileOf[i]] + (lineOf[i] ? ":" + lineOf[i] : ""), "dim");
    var t = totalOf[i] + " samples, " + pct(totalOf[i], all) + " of all";
    if (zoom !== 0) t += ", " + pct(totalOf[i], totalOf[zoom]) + " of the zoomed frame";
    line(t);
    line("self: " + selfOf[i] + " samples, " + pct(selfOf[i], all));
    if (kinds[kindOf[i]]) line(kinds[kindOf[i]] + " frame", "dim");
    line(i === zoom && i !== 0 ? "click: zoom out" : "click: zoom in", "dim");
  }

  framesEl.addEventListener("mousemove", function (e) {
    var el = e.target.closest ? e.target.closest(".frame") : null;
    if (!el) {
      tip.hidden = true;
      return;
    }
    fillTip(el);
    tip.hidden = false;
    var x = e.clientX + 14, y = e.clientY + 16;
    if (x + tip.offsetWidth > window.innerWidth) x = Math.max(0, e.clientX - tip.offsetWidth - 14);
    if (y + tip.offsetHeight > window.innerHeight) y = Math.max(0, e.clientY - tip.offsetHeight - 10);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  });
  framesEl.addEventListener("mouseleave", function () {
    tip.hidden = true;
  });
  framesEl.addEventListener("click", function (e) {
    var el = e.target.closest ? e.target.closest(".frame") : null;
    if (!el || el.classList.contains("merged")) return;
    var i = +el.getAttribute("data-id");
    zoomTo(i === zoom ? Math.max(parentOf[i], 0) : i);
  });
  resetEl.addEventListener("click", function () {
    zoomTo(0);
  });
  icicleEl.addEventListener("change", setLayout);
  flameEl.addEventListener("change", setLayout);

  // search highlights the frames whose name matches and sums the samples under the
  // outermost matches: a match inside a match is the same samples again.
  function search() {
    var q = searchEl.value, test = null;
    searchEl.classList.remove("invalid");
    if (q !== "" && regexEl.checked) {
      try {
        var re = new RegExp(q);
        test = function (s) { return re.test(s); };
      } catch (err) {
        searchEl.classList.add("invalid");
      }
    } else if (q !== "") {
      test = function (s) { return s.indexOf(q) >= 0; };
    }
    matched.fill(0);
    matchedSamples = 0;
    if (test) {
      var memo = new Int8Array(strs.length); // per name: 0 not tried, 1 matches, 2 does not
      for (var i = 1; i < n; i++) {
        var s = nameOf[i];
        if (!memo[s]) memo[s] = test(strs[s]) ? 1 : 2;
        if (memo[s] === 1) matched[i] = 1;
      }
      for (i = 1; i < n;) {
        if (matched[i]) {
          matchedSamples += totalOf[i];
          i = endOf[i];
        } else {
          i++;
        }
      }
      matchEl.textContent = "Matched: " + pct(matchedSamples, all) + " (" + matchedSamples + " of " + all + " samples)";
    } else {
      matchEl.textContent = searchEl.classList.contains("invalid") ? "invalid regular expression" : "";
    }
    render();
  }
  searchEl.addEventListener("input", search);
  regexEl.addEventListener("change", search);

  document.addEventListener("keydown", function (e) {
    // A slash typed into the search or the process filter is part of the query.
    var typing = document.activeElement && document.activeElement.tagName === "INPUT" &&
      (document.activeElement.type === "search" || document.activeElement.type === "text");
    if (e.key === "/" && !typing) {
      e.preventDefault();
      searchEl.focus();
    } else if (e.key === "Escape") {
      if (document.activeElement === searchEl && searchEl.value !== "") {
        searchEl.value = "";
        search();
      } else {
        zoomTo(0);
      }
    }
  });

  function escapeRegExp(s) {
    return s.replace(/[.*+?^${}()|[\]\\\/]/g, "\\$&");
  }

  (function topTable() {
    var tbody = document.querySelector("#top tbody");
    var frag = document.createDocumentFragment();
    data.top.forEach(function (r) {
      var tr = document.createElement("tr");
      [pct(r[1], all), pct(r[2], all), strs[r[0]]].forEach(function (text, k) {
        var td = document.createElement("td");
        td.className = k < 2 ? "num" : "name";
        td.textContent = text;
        tr.appendChild(td);
      });
      tr.title = "highlight " + strs[r[0]];
      tr.addEventListener("click", function () {
        regexEl.checked = true;
        searchEl.value = "^" + escapeRegExp(strs[r[0]]) + "$";
        search();
      });
      frag.appendChild(tr);
    });
    tbody.appendChild(frag);
    if (data.topMore > 0) {
      var more = document.getElementById("top-more");
      more.textContent = "and " + data.topMore + " more functions";
      more.hidden = false;
    }
  })();

  (function facts() {
    var dl = document.getElementById("facts"), f = data.facts;
    function fact(label, value) {
      var div = document.createElement("div"), dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = label;
      dd.textContent = value;
      div.appendChild(dt);
      div.appendChild(dd);
      dl.appendChild(div);
    }
    if (f.host) fact("host", f.host);
    if (f.processes && f.processes.length + (f.processesMore || 0) === 1) {
      fact("process", f.processes[0].name + " (" + f.processes[0].pid + ")");
    } else if (f.processes) {
      processList(f.processes, f.processesMore || 0);
    }
    if (f.start) fact("start", f.start);
    if (f.end) fact("end", f.end);
    if (f.durationSeconds) fact("duration", f.durationSeconds.toFixed(f.durationSeconds < 10 ? 2 : 1) + " s");
    if (f.frequencyHz) fact("frequency", (Math.round(f.frequencyHz * 100) / 100) + " Hz");
    fact("samples", String(f.samples));
    fact("lost samples", f.lostSamples == null ? "unknown" : String(f.lostSamples));
    if (f.version) fact("sonde", f.version);
    if (f.command) fact("command", f.command);
    if (f.note) {
      var note = document.getElementById("note");
      note.textContent = f.note;
      note.hidden = false;
    }
  })();

  // processList folds a host's hundreds of processes into one line, their count and
  // the busiest of them as far as they fit; opened, it lists them all with a filter.
  function processList(procs, more) {
    var box = document.getElementById("processes");
    var filterEl = document.getElementById("processes-filter");
    var shownEl = document.getElementById("processes-shown");
    var list = document.getElementById("processes-list");
    var count = procs.length + more;
    document.getElementById("processes-count").textContent = count + " processes";
    // Forty fill the widest window's line; the rest would be cut off unseen anyway.
    var preview = procs.slice(0, 40).map(function (p) { return p.name + " (" + p.pid + ")"; });
    document.getElementById("processes-preview").textContent = ": " + preview.join(", ") + (count > preview.length ? ", \u2026" : "");
    var items = [], keys = [], frag = document.createDocumentFragment();
    procs.forEach(function (p) {
      var li = document.createElement("li"), share = document.createElement("span");
      li.textContent = p.name + " (" + p.pid + ") ";
      share.className = "share";
      share.textContent = pct(p.samples, data.facts.samples);
      li.appendChild(share);
      li.title = p.name + " (PID " + p.pid + "): " + p.samples + " samples";
      items.push(li);
      keys.push(p.name.toLowerCase() + "\n" + p.pid);
      frag.appendChild(li);
    });
    list.appendChild(frag);
    if (more > 0) {
      var moreEl = document.getElementById("processes-more");
      moreEl.textContent = "and " + more + " more processes, not listed";
      moreEl.hidden = false;
    }
    // A query matches a name or a PID in part, case aside; it never spans the two.
    function filter() {
      var q = filterEl.value.trim().toLowerCase(), shown = 0;
      for (var i = 0; i < items.length; i++) {
        var k = keys[i], cut = k.indexOf("\n");
        var hit = q === "" || k.slice(0, cut).indexOf(q) >= 0 || k.slice(cut + 1).indexOf(q) >= 0;
        items[i].hidden = !hit;
        if (hit) shown++;
      }
      shownEl.textContent = q === "" ? "" : shown === 0 ? "no process matches" : shown + " of " + items.length + " listed";
    }
    filterEl.addEventListener("input", filter);
    filterEl.addEventListener("keydown", function (e) {
      if (e.key === "Escape" && filterEl.value !== "") {
        e.preventDefault();
        e.stopPropagation(); // the page's Escape would zoom out
        filterEl.value = "";
        filter();
      }
    });
    box.addEventListener("toggle", function () {
      if (box.open) filterEl.focus();
    });
    box.hidden = false;
  }

  // The toolbar stays on top as the page scrolls; the top table sticks below it.
  function toolbarHeight() {
    document.documentElement.style.setProperty("--toolbar-h", toolbarEl.offsetHeight + "px");
  }
  toolbarHeight();

  var pending = false;
  window.addEventListener("resize", function () {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () {
      pending = false;
      toolbarHeight();
      render();
    });
  });

  render();

  // For tests and the curious: what the page shows, without reading pixels.
  window.sondeFlame = {
    ready: true,
    total: all,
    nodes: n,
    zoomed: function () { return zoom; },
    layout: function () { return icicle ? "icicle" : "flame"; },
    matchedSamples: function () { return matchedSamples; }
  };
})();

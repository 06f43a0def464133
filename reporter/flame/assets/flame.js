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
  var maxDepth = 0;
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
      if (depthOf[i] > maxDepth) maxDepth = depthOf[i];
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
  var resetEl = document.getElementById("reset");

  var zoom = 0, icicle = false;
  var matched = new Uint8Array(n), matchedSamples = 0;

  function topOf(depth) {
    return (icicle ? depth : maxDepth - depth) * FRAME_H;
  }

  function frameBox(i, left, width, extra) {
    var el = document.createElement("div");
    el.className = "frame" + extra + (matched[i] ? " match" : "");
    el.style.left = left + "px";
    el.style.width = width + "px";
    el.style.top = topOf(depthOf[i]) + "px";
    el.style.background = colour(i);
    el.setAttribute("data-id", i);
    if (width >= LABEL_MIN_W) el.textContent = strs[nameOf[i]] + " (" + pct(totalOf[i], all) + ")";
    return el;
  }

  function mergedBox(depth, left, width, count, samples) {
    var el = document.createElement("div");
    el.className = "frame merged";
    el.style.left = left + "px";
    el.style.width = width + "px";
    el.style.top = topOf(depth) + "px";
    el.setAttribute("data-merged", count);
    el.setAttribute("data-samples", samples);
    return el;
  }

  // render draws the zoomed frame across the full width, its ancestors faded below it
  // (above it in icicle layout) and its descendants to scale. Frames narrower than
  // MIN_W are not drawn, nor their descendants: each run of them becomes one hatched
  // box, so a graph of a hundred thousand nodes draws a few thousand elements.
  function render() {
    framesEl.textContent = "";
    if (all <= 0) {
      document.getElementById("empty").hidden = false;
      framesEl.style.height = "0";
      return;
    }
    var width = framesEl.clientWidth;
    framesEl.style.height = (maxDepth + 1) * FRAME_H + "px";
    var zx = xOf[zoom], scale = width / totalOf[zoom];
    var frag = document.createDocumentFragment();
    for (var a = parentOf[zoom]; a >= 0; a = parentOf[a]) frag.appendChild(frameBox(a, 0, width, " ancestor"));
    var end = endOf[zoom], i = zoom;
    while (i < end) {
      var w = totalOf[i] * scale;
      if (w >= MIN_W || i === zoom) {
        frag.appendChild(frameBox(i, (xOf[i] - zx) * scale, w, ""));
        i++;
        continue;
      }
      var pend = endOf[parentOf[i]], sum = 0, count = 0, j = i;
      while (j < pend && totalOf[j] * scale < MIN_W) {
        sum += totalOf[j];
        count++;
        j = endOf[j];
      }
      if (sum * scale >= MIN_W) frag.appendChild(mergedBox(depthOf[i], (xOf[i] - zx) * scale, sum * scale, count, sum));
      i = j;
    }
    framesEl.appendChild(frag);
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
  icicleEl.addEventListener("change", function () {
    icicle = icicleEl.checked;
    render();
  });

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
    if (e.key === "/" && document.activeElement !== searchEl) {
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
    if (f.processes) {
      var ps = f.processes.map(function (p) { return p.name + " (" + p.pid + ")"; }).join(", ");
      if (f.processesMore) ps += " and " + f.processesMore + " more";
      fact(f.processes.length + (f.processesMore || 0) === 1 ? "process" : "processes", ps);
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

  var pending = false;
  window.addEventListener("resize", function () {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () {
      pending = false;
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
    matchedSamples: function () { return matchedSamples; }
  };
})();

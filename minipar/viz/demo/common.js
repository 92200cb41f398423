// minipar demo, common: the embedded data, the palette, DOM and SVG helpers, and the number
// formats (minipar's: fmt_bytes' binary units, Python's rounding of exact ties).
var DATA = JSON.parse(document.getElementById("demo-data").textContent);
// Okabe & Ito's colour-blind-safe palette; colours repeat after 8, the text labels do not
var PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00",
               "#CC79A7", "#000000"];
// SVG's namespace, as the HTML parser gives it (the page holds no address, not even that)
var SVGNS = (function () {
  var d = document.createElement("div");
  d.innerHTML = "<svg></svg>";
  return d.firstChild.namespaceURI;
})();

function $(id) { return document.getElementById(id); }

// an HTML element: el("p", {class: "note", id: "x"}, "text")
function el(tag, attrs, text) {
  var e = document.createElement(tag);
  Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}

// an SVG element, the same way
function svgEl(tag, attrs, text) {
  var e = document.createElementNS(SVGNS, tag);
  Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
  if (text !== undefined && text !== null) e.textContent = text;
  return e;
}

// a drawing's root: drawn W x H pixels to its container's width, and scaled with it (by
// its viewBox) until it is drawn again
function svgRoot(W, H, label) {
  var g = svgEl("svg", {viewBox: "0 0 " + W + " " + H, width: "100%", role: "img",
                        "aria-label": label, preserveAspectRatio: "xMinYMin meet"});
  g.style.maxWidth = W + "px";
  return g;
}

// the root font size in pixels (1rem): the drawings size their text and rows by it
function rem() { return parseFloat(getComputedStyle(document.documentElement).fontSize); }

// a container's usable width in pixels, inside its padding (its drawings are drawn to it,
// and again when the page's width changes)
function widthOf(node) {
  var cs = getComputedStyle(node);
  return Math.max(320, Math.floor((node.clientWidth || 0) - parseFloat(cs.paddingLeft) -
                                  parseFloat(cs.paddingRight)));
}

// x with d decimals, as Python's format(x, ".{d}f") writes it: the nearest, and at an
// exact tie the even last digit (JS's toFixed takes the larger). A tie is only possible
// when x * 2^(d+1) is an odd integer (x = q / 2^(d+1), q odd), which is exact to test.
function fixed(x, d) {
  var q = x * Math.pow(2, d + 1);
  if (Number.isInteger(q) && Math.abs(q) % 2 === 1 && Math.abs(q) < 1e15) {
    var lower = (Math.abs(q) * Math.pow(5, d) - 1) / 2;  // |x| * 10^d = lower + 1/2
    var even = lower % 2 === 0 ? lower : lower + 1;
    return (x < 0 ? "-" : "") + (even / Math.pow(10, d)).toFixed(d);
  }
  return x.toFixed(d);
}

// bytes in binary units, as minipar's runtime.ledger.fmt_bytes: "12.34 GiB", "512 B"
function fmtBytes(n) {
  var units = ["B", "KiB", "MiB", "GiB", "TiB"];
  for (var i = 0; i < units.length; i++) {
    if (Math.abs(n) < 1024 || i === units.length - 1) {
      return i === 0 ? fixed(n, 0) + " B" : fixed(n, 2) + " " + units[i];
    }
    n /= 1024;
  }
}

// the unit a duration is written in: [name, seconds per unit]
function timeUnit(t) {
  var a = Math.abs(t);
  if (a === 0 || a >= 1) return ["s", 1];
  if (a >= 1e-3) return ["ms", 1e-3];
  if (a >= 1e-6) return ["µs", 1e-6];
  return ["ns", 1e-9];
}

// 4 significant digits (trailing zeros kept): 15.32, 293.4, 1.069
function sig4(v) { return Math.abs(v) >= 1e4 ? String(Math.round(v)) : v.toPrecision(4); }

// a duration for people: "15.32 s", "293.4 µs"
function fmtTime(t) {
  var u = timeUnit(t);
  return t === 0 ? "0 s" : sig4(t / u[1]) + " " + u[0];
}

// a duration in a given unit (an axis's): "12.5"
function inUnit(t, u) { return String(Number((t / u[1]).toPrecision(6))); }

// a fraction as a percentage with one decimal: "71.8%"
function pct(x) { return fixed(x * 100, 1) + "%"; }

// MFU as a percentage with 3 significant digits: "41.3%"
function mfuText(x) { return (x * 100).toPrecision(3) + "%"; }

// 70628278272 -> "70,628,278,272"
function thousands(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

// [0, 1, 2, 3, 8, 9] -> "0-3, 8-9"
function rangesText(list) {
  var xs = list.slice().sort(function (a, b) { return a - b; }), out = [], i = 0;
  while (i < xs.length) {
    var j = i;
    while (j + 1 < xs.length && xs[j + 1] === xs[j] + 1) j++;
    out.push(j === i ? String(xs[i]) : j === i + 1 ? xs[i] + ", " + xs[j] : xs[i] + "-" + xs[j]);
    i = j + 1;
  }
  return out.join(", ");
}

function plural(n, word) { return n + " " + word + (n === 1 ? "" : "s"); }

// "rank 0 (pp 0, dp 0, tp 0)"
function rankLabel(row) {
  return "rank " + row.rank + " (pp " + row.pp_stage + ", dp " + row.dp_replica + ", tp " +
         row.tp_index + ")";
}

// every rank of pipeline stage p, by ParallelDims' rule rank = t + tp (d + dp p)
function stageRanks(s, p) {
  var out = [];
  for (var d = 0; d < s.dp; d++) {
    for (var t = 0; t < s.tp; t++) out.push(t + s.tp * (d + s.dp * p));
  }
  return out;
}

// the ranks a scenario's listed ranks stand for: themselves when every rank is a row, else
// every rank of their pipeline stages (a drawn rank's tp and dp peers do the same work)
function allRanks(sc, ranks) {
  if (sc.every_rank) return ranks.slice();
  var s = sc.scenario, out = [], seen = {};
  ranks.forEach(function (r) {
    var p = Math.floor(r / (s.tp * s.dp));
    if (!seen[p]) { seen[p] = 1; out = out.concat(stageRanks(s, p)); }
  });
  return out.sort(function (a, b) { return a - b; });
}

// a swatch and its text, for the legends
function legendItem(colour, text, extraClass) {
  var li = el("li");
  var sw = el("span", {"class": "swatch" + (extraClass ? " " + extraClass : ""),
                       "aria-hidden": "true"});
  sw.style.background = colour;
  li.appendChild(sw);
  li.appendChild(document.createTextNode(text));
  return li;
}

// axis ticks: about n round values from 0 to max (1, 2 or 5 times a power of ten)
function ticks(max, n) {
  if (!(max > 0)) return [0];
  var raw = max / n, p = Math.pow(10, Math.floor(Math.log10(raw))), step = p;
  [1, 2, 5, 10].some(function (k) { step = k * p; return step >= raw; });
  var out = [];
  for (var v = 0; v <= max * (1 + 1e-9); v += step) out.push(v);
  return out;
}

// the scenario's memory categories, in stacking order, with their colours and names
var CATEGORIES = [["parameters", "#0072B2", "parameters"],
                  ["gradients", "#56B4E9", "gradients"],
                  ["optimizer_states", "#009E73", "optimizer states"],
                  ["activations", "#E69F00", "activations"],
                  ["comm_buffers", "#CC79A7", "communication buffers"],
                  ["other", "#F0E442", "other"]];

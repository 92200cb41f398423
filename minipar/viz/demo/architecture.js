// minipar demo, architecture mode: the mesh laid on nodes and GPUs.
var WHAT = {pp: "pp stage", dp: "dp replica", tp: "tp group"};
var arch = {layout: null, source: "", colour: "pp", selected: null};

// The rule of ParallelDims' default order (tp-cp-ep-dp-pp, tp fastest):
//   rank = i_tp + tp * (i_dp + dp * i_pp),  node = rank // gpus_per_node
function computeLayout(dp, tp, pp, gpn) {
  var world = dp * tp * pp, ranks = [], r, i;
  function rankOf(t, d, p) { return t + tp * (d + dp * p); }
  for (r = 0; r < world; r++) {
    var t = r % tp, d = Math.floor(r / tp) % dp, p = Math.floor(r / (tp * dp));
    var tpg = [], ppg = [], dpg = [];
    for (i = 0; i < tp; i++) tpg.push(rankOf(i, d, p));
    for (i = 0; i < pp; i++) ppg.push(rankOf(t, d, i));
    for (i = 0; i < dp; i++) dpg.push(rankOf(t, i, p));
    ranks.push({rank: r, node: Math.floor(r / gpn), tp_index: t, pp_stage: p,
                dp_replica: d, tp: tpg, pp: ppg, dp: dpg});
  }
  return {key: dp + "x" + tp + "x" + pp, title: "DP " + dp + " x TP " + tp + " x PP " + pp,
          dp: dp, tp: tp, pp: pp, gpus: world, gpus_per_node: gpn,
          nodes: Math.ceil(world / gpn), ranks: ranks};
}

function embeddedLayout(dp, tp, pp) {
  return DATA.layouts.filter(function (l) {
    return l.dp === dp && l.tp === tp && l.pp === pp; })[0] || null;
}

function groupText(g) {
  var run = g.length > 2 && g[g.length - 1] - g[0] === g.length - 1;
  if (run) return "[" + g[0] + ".." + g[g.length - 1] + "]";
  if (g.length <= 8) return "[" + g.join(", ") + "]";
  return "[" + g.slice(0, 3).join(", ") + ", ..., " + g[g.length - 1] + "] (" + g.length +
         " ranks)";
}

function linkText(layout, g) {
  var nodes = [];
  g.forEach(function (r) {
    var n = layout.ranks[r].node;
    if (nodes.indexOf(n) < 0) nodes.push(n);
  });
  if (nodes.length === 1) return "inside node " + nodes[0] + ": NVLink";
  return "across " + nodes.length + " nodes (" + groupText(nodes).replace(/[\[\]]/g, "") +
         "): InfiniBand";
}

function colourIndex(layout, rec) {
  if (arch.colour === "pp") return rec.pp_stage;
  if (arch.colour === "dp") return rec.dp_replica;
  return Math.floor(rec.tp[0] / layout.tp);  // a tp group is tp consecutive ranks
}

function tile(layout, rec) {
  var b = document.createElement("button");
  b.type = "button";
  b.className = "gpu";
  b.dataset.rank = rec.rank;
  b.dataset.node = rec.node;
  b.setAttribute("aria-label", "rank " + rec.rank + ", node " + rec.node + ", pp stage " +
                 rec.pp_stage + ", dp replica " + rec.dp_replica + ", tp index " +
                 rec.tp_index);
  var c = PALETTE[colourIndex(layout, rec) % PALETTE.length];
  b.style.borderTopColor = c;
  b.style.backgroundColor = c + "33";
  b.innerHTML = '<span class="r">' + rec.rank + '</span><span class="marks"></span>' +
                '<span class="c">pp' + rec.pp_stage + " dp" + rec.dp_replica + " tp" +
                rec.tp_index + "</span>";
  b.addEventListener("mouseenter", function () { selectGpu(rec.rank); });
  b.addEventListener("focus", function () { selectGpu(rec.rank); });
  return b;
}

function drawCluster(layout) {
  var cluster = $("cluster");
  cluster.innerHTML = "";
  cluster.classList.remove("has-selection");
  for (var n = 0; n < layout.nodes; n++) {
    var node = document.createElement("div");
    node.className = "node";
    node.dataset.node = n;
    var h = document.createElement("h3");
    h.textContent = "node " + n + " (NVLink inside)";
    var gpus = document.createElement("div");
    gpus.className = "gpus";
    layout.ranks.forEach(function (rec) {
      if (rec.node === n) gpus.appendChild(tile(layout, rec));
    });
    node.appendChild(h);
    node.appendChild(gpus);
    cluster.appendChild(node);
  }
}

function drawArchLegend(layout) {
  var legend = $("legend"), seen = {}, items = [];
  legend.innerHTML = "";
  layout.ranks.forEach(function (rec) {
    var k = colourIndex(layout, rec);
    if (!(k in seen)) { seen[k] = 1; items.push(k); }
  });
  items.slice(0, 16).forEach(function (k) {
    var li = document.createElement("li");
    li.innerHTML = '<span class="swatch" style="background:' +
                   PALETTE[k % PALETTE.length] + '"></span>' + WHAT[arch.colour] + " " + k;
    legend.appendChild(li);
  });
  if (items.length > PALETTE.length) {
    var more = document.createElement("li");
    more.textContent = items.length + " in all: colours repeat after " + PALETTE.length +
                       "; the labels on the GPUs are exact";
    legend.appendChild(more);
  }
}

function drawLayout(layout, source) {
  arch.layout = layout;
  arch.source = source;
  arch.selected = null;
  $("n-gpus").textContent = layout.gpus;
  $("n-nodes").textContent = layout.nodes;
  $("n-per-node").textContent = layout.gpus_per_node;
  $("n-tp-groups").textContent = layout.gpus / layout.tp;
  $("n-pp-groups").textContent = layout.gpus / layout.pp;
  $("n-dp-groups").textContent = layout.gpus / layout.dp;
  $("source").textContent = source === "python"
    ? "Groups from minipar: ParallelGroups of this layout, built on simulated devices " +
      "when the page was written."
    : "Groups computed in this page by the rule below (the same as minipar's " +
      "ParallelDims default order); run `minipar demo --layout " + layout.dp + "x" +
      layout.tp + "x" + layout.pp + "` to embed minipar's own.";
  $("info").textContent = "Point at a GPU or tab to one.";
  drawCluster(layout);
  drawArchLegend(layout);
}

function selectGpu(rank) {
  var layout = arch.layout, rec = layout.ranks[rank];
  arch.selected = rank;
  $("cluster").classList.add("has-selection");
  Array.prototype.forEach.call(document.querySelectorAll(".gpu"), function (b) {
    var r = Number(b.dataset.rank), marks = "";
    b.classList.toggle("selected", r === rank);
    [["tp", "T"], ["pp", "P"], ["dp", "D"]].forEach(function (kv) {
      var inside = rec[kv[0]].indexOf(r) >= 0;
      b.classList.toggle("in-" + kv[0], inside);
      if (inside) marks += kv[1];
    });
    b.querySelector(".marks").textContent = marks;
  });
  var lines = [
    "rank " + rank + ": node " + rec.node + ", tp group " + groupText(rec.tp) +
      ", pp stage " + rec.pp_stage + ", dp replica " + rec.dp_replica,
    "tp group " + groupText(rec.tp) + " (marked T, outlined): " + linkText(layout, rec.tp),
    "pp group " + groupText(rec.pp) + " (marked P, hatched): " + linkText(layout, rec.pp),
    "dp group " + groupText(rec.dp) + " (marked D, underlined): " + linkText(layout, rec.dp)];
  $("info").innerHTML = "";
  lines.forEach(function (t, i) {
    var p = document.createElement("p");
    p.textContent = t;
    if (i === 0) p.id = "info-summary";
    $("info").appendChild(p);
  });
}

function fillSelect(id, values, current) {
  var s = $(id);
  s.innerHTML = "";
  values.forEach(function (v) {
    var o = document.createElement("option");
    o.value = String(v);
    o.textContent = String(v);
    s.appendChild(o);
  });
  s.value = String(current);
}

function layoutFromControls() {
  var dp = Number($("dp").value), tp = Number($("tp").value), pp = Number($("pp").value);
  var l = embeddedLayout(dp, tp, pp);
  $("preset").value = l ? l.key : "custom";
  $("message").textContent = dp * tp * pp > DATA.max_gpus
    ? dp * tp * pp + " GPUs: a large picture; zoom out to see it whole" : "";
  if (l) drawLayout(l, "python");
  else drawLayout(computeLayout(dp, tp, pp, DATA.gpus_per_node), "page");
}

function setUpArchitecture() {
  var choices = DATA.choices;
  DATA.layouts.forEach(function (l) {  // every embedded layout can be picked
    ["dp", "tp", "pp"].forEach(function (k) {
      if (choices[k].indexOf(l[k]) < 0) choices[k].push(l[k]);
    });
  });
  ["dp", "tp", "pp"].forEach(function (k) {
    choices[k].sort(function (a, b) { return a - b; });
    fillSelect(k, choices[k], DATA.layouts[0][k]);
    $(k).addEventListener("change", layoutFromControls);
  });
  var preset = $("preset");
  DATA.layouts.concat([{key: "custom", title: "custom (computed in the page)"}])
    .forEach(function (l) {
      var o = document.createElement("option");
      o.value = l.key;
      o.textContent = l.title;
      preset.appendChild(o);
    });
  preset.addEventListener("change", function () {
    var l = DATA.layouts.filter(function (x) { return x.key === preset.value; })[0];
    if (!l) return;  // "custom": keep the sizes, pick them with the selects
    ["dp", "tp", "pp"].forEach(function (k) { $(k).value = String(l[k]); });
    layoutFromControls();
  });
  $("colour").addEventListener("change", function () {
    arch.colour = $("colour").value;
    var sel = arch.selected;
    drawLayout(arch.layout, arch.source);
    if (sel !== null) selectGpu(sel);
  });
  $("cluster").addEventListener("keydown", function (e) {
    var step = {ArrowRight: 1, ArrowLeft: -1, ArrowDown: DATA.gpus_per_node,
                ArrowUp: -DATA.gpus_per_node}[e.key];
    var here = document.activeElement && document.activeElement.dataset.rank;
    if (step === undefined || here === undefined) return;
    var next = document.querySelector('.gpu[data-rank="' + (Number(here) + step) + '"]');
    if (next) { e.preventDefault(); next.focus(); }
  });
  var captions = $("captions");
  [["dp", "DP, data parallelism"], ["tp", "TP, tensor parallelism"],
   ["pp", "PP, pipeline parallelism"]].forEach(function (kv) {
    var dt = document.createElement("dt"), dd = document.createElement("dd");
    dt.textContent = kv[1];
    dd.textContent = DATA.captions[kv[0]];
    captions.appendChild(dt);
    captions.appendChild(dd);
  });
}

// the page's rule must give minipar's groups for every embedded layout
function checkEmbedded() {
  DATA.layouts.forEach(function (l) {
    var mine = computeLayout(l.dp, l.tp, l.pp, l.gpus_per_node);
    if (JSON.stringify(mine.ranks) !== JSON.stringify(l.ranks)) {
      console.error("minipar demo: the page's rule disagrees with ParallelGroups for " +
                    l.title);
    }
  });
}

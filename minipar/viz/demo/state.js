// minipar demo, state mode: each rank's memory. Bars: what fills it at its peak, by
// category (the ledger's, or the dry run's model states plus activations, or the planner's);
// a curve: the selected rank's memory over the step, stacked by category (a step function).
var ST = {key: null, rank: null};
var INSTANT = "#bbbbbb";

// the binary unit axis ticks are written in: [name, bytes]
function byteUnit(max) {
  var units = [["B", 1], ["KiB", 1024], ["MiB", Math.pow(1024, 2)], ["GiB", Math.pow(1024, 3)],
               ["TiB", Math.pow(1024, 4)]], u = units[0];
  units.forEach(function (x) { if (max >= x[1]) u = x; });
  return u;
}

// a row's memory at the highest point of its curve: {category: bytes, total, t}
function atPeak(row) {
  var m = row.memory, best = null;
  if (!m) {
    var out = {t: null, total: 0};
    CATEGORIES.forEach(function (c) { out[c[0]] = row.peak[c[0]] || 0; out.total += out[c[0]]; });
    return out;
  }
  for (var i = 0; i < m.t.length; i++) {
    var tot = 0;
    CATEGORIES.forEach(function (c) { tot += m[c[0]][i]; });
    if (!best || tot > best.total) {
      best = {t: m.t[i], total: tot};
      CATEGORIES.forEach(function (c) { best[c[0]] = m[c[0]][i]; });
    }
  }
  return best;
}

// the capacity is drawn when it is within a quarter more than the largest peak
function capacityShown(sc, max) { return sc.capacity <= max * 1.25; }

function drawStateLegend(sc) {
  var ul = $("state-legend"), max = 0, instant = false;
  ul.innerHTML = "";
  sc.rows.forEach(function (r) {
    max = Math.max(max, r.peak.total);
    instant = instant || (r.memory && r.peak.total > atPeak(r).total);
  });
  CATEGORIES.forEach(function (c) { ul.appendChild(legendItem(c[1], c[2])); });
  if (instant) {
    ul.appendChild(legendItem(INSTANT, "held for no simulated time at the peak (not in " +
                              "the curve)", "dashed"));
  }
  if (capacityShown(sc, max)) {
    var cap = el("li");
    cap.appendChild(el("span", {"class": "capacity-key", "aria-hidden": "true"}));
    cap.appendChild(document.createTextNode("the GPU's capacity, " + fmtBytes(sc.capacity)));
    ul.appendChild(cap);
  }
}

function drawBars(sc) {
  var box = $("state-bars"), R = rem(), W = widthOf(box), rows = sc.rows;
  box.innerHTML = "";
  var peaks = rows.map(atPeak), max = 0;
  rows.forEach(function (r) { max = Math.max(max, r.peak.total); });
  var showCap = capacityShown(sc, max), scale = showCap ? Math.max(max, sc.capacity) : max;
  var labels = rows.map(rankLabel), longest = Math.max.apply(null, labels.map(function (l) {
    return l.length; }));
  var font = 0.8 * R, labelW = Math.min(W * 0.4, longest * font * 0.55 + 8);
  var valueW = 6 * R, barW = W - labelW - valueW, rowH = 1.5 * R, top = 1.3 * R;
  var H = top + rows.length * rowH + 0.3 * R;
  var g = svgRoot(W, H, "peak memory of each drawn rank, stacked by category; the table " +
                  "below gives the numbers");
  rows.forEach(function (r, i) {
    var y = top + i * rowH, x = labelW, p = peaks[i];
    g.appendChild(svgEl("text", {x: labelW - 6, y: y + rowH * 0.62, "text-anchor": "end",
                                 "font-size": font}, labels[i]));
    CATEGORIES.forEach(function (c) {
      var w = p[c[0]] / scale * barW;
      if (w <= 0) return;
      var rect = svgEl("rect", {x: x, y: y + 0.15 * R, width: w, height: rowH - 0.35 * R,
                                fill: c[1], stroke: "#333", "stroke-width": 0.5});
      rect.appendChild(svgEl("title", {}, labels[i] + ": " + c[2] + " " + fmtBytes(p[c[0]]) +
                                          " at the peak"));
      g.appendChild(rect);
      x += w;
    });
    var rest = (r.peak.total - p.total) / scale * barW;
    if (rest > 0.5) {
      g.appendChild(svgEl("rect", {x: x, y: y + 0.15 * R, width: rest, height: rowH - 0.35 * R,
                                   fill: INSTANT, stroke: "#000", "stroke-width": 1,
                                   "stroke-dasharray": "2 2"}));
      x += rest;
    }
    g.appendChild(svgEl("text", {x: labelW + r.peak.total / scale * barW + 5,
                                 y: y + rowH * 0.62, "font-size": font,
                                 "font-weight": "700"}, fmtBytes(r.peak.total)));
  });
  if (showCap) {
    var cx = labelW + sc.capacity / scale * barW;
    g.appendChild(svgEl("line", {x1: cx, x2: cx, y1: top - 0.2 * R, y2: H, stroke: "#000",
                                 "stroke-width": 2, "stroke-dasharray": "5 3"}));
    g.appendChild(svgEl("text", {x: cx, y: top - 0.35 * R, "text-anchor": "middle",
                                 "font-size": font}, "capacity " + fmtBytes(sc.capacity)));
  }
  box.appendChild(g);
  var what = {run: "Every rank's ledger: what it holds at the moment of its peak.",
              "dry-run": "One rank a pipeline stage (its tp and dp peers hold the same): " +
                         "the model states and the activations held at the peak.",
              planner: "The planner's memory of the first pipeline rank: each category's " +
                       "peak."}[sc.source];
  $("state-bars-text").textContent = what + (showCap ? "" : " The capacity, " +
    fmtBytes(sc.capacity) + ", is far off this scale: the largest peak is " +
    (max / sc.capacity * 100).toPrecision(2) + "% of it.");
}

function drawStateTable(sc) {
  var t = $("state-table");
  t.innerHTML = "";
  t.appendChild(el("caption", {}, "Each category's own peak, and the peak of the total " +
    "(categories can peak at different moments, so the total can be less than their sum)"));
  var head = el("tr");
  head.appendChild(el("th", {scope: "col"}, "rank"));
  CATEGORIES.forEach(function (c) { head.appendChild(el("th", {scope: "col"}, c[2])); });
  head.appendChild(el("th", {scope: "col"}, "peak (total)"));
  var thead = el("thead"), tbody = el("tbody");
  thead.appendChild(head);
  sc.rows.forEach(function (r) {
    var tr = el("tr", {"data-rank": r.rank});
    tr.appendChild(el("th", {scope: "row"}, rankLabel(r)));
    CATEGORIES.forEach(function (c) {
      tr.appendChild(el("td", {"data-value": r.peak[c[0]] || 0}, fmtBytes(r.peak[c[0]] || 0)));
    });
    tr.appendChild(el("td", {"class": "total", "data-value": r.peak.total},
                      fmtBytes(r.peak.total)));
    tbody.appendChild(tr);
  });
  t.appendChild(thead);
  t.appendChild(tbody);
}

function drawCurve(sc) {
  var box = $("state-curve"), select = $("state-rank");
  box.innerHTML = "";
  var rows = sc.rows.filter(function (r) { return r.memory; });
  $("state-rank-label").hidden = !rows.length;
  if (!rows.length) {
    $("state-curve-text").textContent = "The planner gives each category's peak, not the " +
      "memory over time: no curve here (ZeRO 0 shows the dry run's).";
    return;
  }
  if (ST.key !== sc.scenario.key) {
    ST.key = sc.scenario.key;
    ST.rank = sc.numbers.peak_rank;
    select.innerHTML = "";
    rows.forEach(function (r) {
      select.appendChild(el("option", {value: r.rank}, rankLabel(r)));
    });
    if (!rows.some(function (r) { return r.rank === ST.rank; })) ST.rank = rows[0].rank;
    select.value = String(ST.rank);
  }
  var row = rows.filter(function (r) { return r.rank === ST.rank; })[0];
  var m = row.memory, T = sc.numbers.step_time, R = rem(), W = widthOf(box), p = atPeak(row);
  var left = 5.2 * R, right = 0.8 * R, top = 1.2 * R, bottom = 2.6 * R, H = 15 * R;
  var pw = W - left - right, ph = H - top - bottom;
  var showCap = capacityShown(sc, p.total), yMax = showCap ? Math.max(p.total,
      sc.capacity) : p.total;
  yMax = yMax || 1;
  function X(t) { return left + t / T * pw; }
  function Y(b) { return top + ph - b / yMax * ph; }
  var g = svgRoot(W, H, rankLabel(row) + ": memory over the step, stacked by category; " +
                  "peak " + fmtBytes(row.peak.total));
  var below = m.t.map(function () { return 0; });
  CATEGORIES.forEach(function (c) {
    var above = below.map(function (b, i) { return b + m[c[0]][i]; });
    if (!above.some(function (v, i) { return v > below[i]; })) return;
    var pts = [];
    for (var i = 0; i < m.t.length; i++) {  // the top edge: along, then up or down
      var t1 = i + 1 < m.t.length ? m.t[i + 1] : T;
      pts.push(X(m.t[i]) + "," + Y(above[i]), X(t1) + "," + Y(above[i]));
    }
    for (var k = m.t.length - 1; k >= 0; k--) {  // the bottom edge, back
      var t2 = k + 1 < m.t.length ? m.t[k + 1] : T;
      pts.push(X(t2) + "," + Y(below[k]), X(m.t[k]) + "," + Y(below[k]));
    }
    var poly = svgEl("polygon", {points: pts.join(" "), fill: c[1], stroke: "#333",
                                 "stroke-width": 0.4});
    poly.appendChild(svgEl("title", {}, c[2]));
    g.appendChild(poly);
    below = above;
  });
  var u = timeUnit(T), bu = byteUnit(yMax);
  ticks(T / u[1], 6).forEach(function (v) {
    var x = X(v * u[1]);
    g.appendChild(svgEl("line", {x1: x, x2: x, y1: top + ph, y2: top + ph + 4, stroke: "#000"}));
    g.appendChild(svgEl("text", {x: x, y: top + ph + 1.1 * R, "text-anchor": "middle",
                                 "font-size": 0.75 * R}, String(Number(v.toPrecision(6)))));
  });
  g.appendChild(svgEl("text", {x: left + pw / 2, y: H - 0.3 * R, "text-anchor": "middle",
                               "font-size": 0.8 * R}, "time in the step (" + u[0] + ")"));
  ticks(yMax / bu[1], 4).forEach(function (v) {
    var y = Y(v * bu[1]);
    g.appendChild(svgEl("line", {x1: left - 4, x2: left + pw, y1: y, y2: y, stroke: "#0002"}));
    g.appendChild(svgEl("text", {x: left - 6, y: y + 0.3 * R, "text-anchor": "end",
                                 "font-size": 0.75 * R}, Number(v.toPrecision(6)) + " " + bu[0]));
  });
  g.appendChild(svgEl("line", {x1: left, x2: left + pw, y1: top + ph, y2: top + ph,
                               stroke: "#000"}));
  if (showCap) {
    var cy = Y(sc.capacity);
    g.appendChild(svgEl("line", {x1: left, x2: left + pw, y1: cy, y2: cy, stroke: "#000",
                                 "stroke-width": 2, "stroke-dasharray": "5 3"}));
    g.appendChild(svgEl("text", {x: left + pw, y: cy - 0.3 * R, "text-anchor": "end",
      "font-size": 0.75 * R}, "capacity " + fmtBytes(sc.capacity)));
  }
  box.appendChild(g);
  $("state-curve-text").textContent = rankLabel(row) + ": highest " + fmtBytes(p.total) +
    " at t = " + fmtTime(p.t) + " (activations " + fmtBytes(p.activations) + " of it)" +
    (row.peak.total > p.total ? "; the ledger's peak, " + fmtBytes(row.peak.total) +
     ", adds buffers held for no simulated time." : ".") +
    (sc.every_rank ? "" : " Its tp and dp peers hold the same.");
}

function drawState(sc) {
  drawStateLegend(sc);
  drawBars(sc);
  drawStateTable(sc);
  drawCurve(sc);
}

function setUpState() {
  $("state-rank").addEventListener("change", function () {
    ST.rank = Number($("state-rank").value);
    if (SC.scenario) drawCurve(SC.scenario);
  });
}

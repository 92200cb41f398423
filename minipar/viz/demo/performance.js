// minipar demo, performance mode: where the step's time goes. Each drawn rank's timeline
// (its 480 cells of compute / communication / both / idle, the pipeline's actions outlined
// on them), the split as a table, and the other schedules of the same layout side by side.
var CELLS = {c: ["#009E73", "compute"], m: ["#E69F00", "communication"],
             o: ["#56B4E9", "compute and communication at once"], ".": ["#ececec", "idle"]};
var ACTION_TEXT = "Outlined boxes: the pipeline's actions, labelled with the micro-batch: " +
  "F forward, B backward, I and W the backward for the input and for the weights (zero " +
  "bubble), & a forward and a backward overlapped; lower case: a rank's later stage " +
  "(interleaved chunks).";

// one scenario's rows as an SVG timeline. o: {width, rowH, font, labelW, T (the time
// scale, default the step's), axis (draw the time axis), label(row) -> text}
function timelineSvg(sc, o) {
  var R = rem(), rows = sc.rows, step = sc.numbers.step_time, T = o.T || step;
  var left = o.labelW, plotW = o.width - left - 0.8 * R, top = 0.2 * R;
  var H = top + rows.length * o.rowH + (o.axis ? 2.6 * R : 0.2 * R);
  var g = svgRoot(o.width, H, o.title);
  function X(t) { return left + t / T * plotW; }
  rows.forEach(function (r, i) {
    var y = top + i * o.rowH, h = o.rowH - 0.2 * R, n = r.cells.length;
    if (o.label) {
      g.appendChild(svgEl("text", {x: left - 5, y: y + o.rowH * 0.62, "text-anchor": "end",
                                   "font-size": o.font}, o.label(r)));
    }
    g.appendChild(svgEl("rect", {x: X(0), y: y, width: X(step) - X(0), height: h,
                                 fill: CELLS["."][0]}));
    for (var k = 0; k < n;) {  // runs of one state
      var ch = r.cells[k], k1 = k;
      while (k1 < n && r.cells[k1] === ch) k1++;
      if (ch !== ".") {
        g.appendChild(svgEl("rect", {x: X(k / n * step), y: y, height: h,
                                     width: X(k1 / n * step) - X(k / n * step),
                                     fill: CELLS[ch][0]}));
      }
      k = k1;
    }
    var first = Math.min.apply(null, r.actions.map(function (a) { return a[4]; }));
    r.actions.forEach(function (a) {
      var x0 = X(a[0]), w = Math.max(1, X(a[1]) - x0);
      var letter = a[2] !== "&" && a[4] !== first ? a[2].toLowerCase() : a[2];
      var label = letter + a[3];
      var box = svgEl("rect", {x: x0, y: y + 0.5, width: w, height: h - 1, fill: "none",
                               stroke: "#000", "stroke-width": 1, "class": "action"});
      box.appendChild(svgEl("title", {}, "rank " + r.rank + ": " + a[2] + " of micro-batch " +
        a[3] + ", stage " + a[4] + ", " + fmtTime(a[0]) + " to " + fmtTime(a[1])));
      g.appendChild(box);
      if (w >= label.length * o.font * 0.62 + 3 && h >= o.font) {
        g.appendChild(svgEl("text", {x: x0 + w / 2, y: y + h / 2 + o.font * 0.35,
          "text-anchor": "middle", "font-size": o.font, "class": "action-label"}, label));
      }
    });
  });
  if (o.axis) {
    var u = timeUnit(T), base = top + rows.length * o.rowH;
    ticks(T / u[1], 8).forEach(function (v) {
      var x = X(v * u[1]);
      g.appendChild(svgEl("line", {x1: x, x2: x, y1: base, y2: base + 4, stroke: "#000"}));
      g.appendChild(svgEl("text", {x: x, y: base + 1.1 * R, "text-anchor": "middle",
                                   "font-size": 0.75 * R}, String(Number(v.toPrecision(6)))));
    });
    g.appendChild(svgEl("text", {x: left + plotW / 2, y: H - 0.3 * R, "text-anchor": "middle",
                                 "font-size": 0.8 * R}, "time in the step (" + u[0] + ")"));
  }
  return g;
}

function drawPerfLegend() {
  var ul = $("perf-legend");
  ul.innerHTML = "";
  ["c", "m", "o", "."].forEach(function (k) {
    ul.appendChild(legendItem(CELLS[k][0], CELLS[k][1]));
  });
  ul.appendChild(legendItem("#fff", "a pipeline action (F3: forward of micro-batch 3)",
                            "outlined"));
}

function drawPerfTable(sc) {
  var t = $("perf-table"), T = sc.numbers.step_time, n = sc.numbers;
  t.innerHTML = "";
  t.appendChild(el("caption", {}, "Where the step's " + fmtTime(T) + " go" +
    (sc.every_rank ? ", rank by rank" : sc.source === "planner" ? "" :
     ", one rank a pipeline stage") + " (the three parts add up to the step time)"));
  var thead = el("thead"), head = el("tr"), tbody = el("tbody");
  ["rank", "compute", "exposed communication", "idle (bubble and waits)"].forEach(function (h) {
    head.appendChild(el("th", {scope: "col"}, h));
  });
  thead.appendChild(head);
  function line(label, split, attrs) {
    var tr = el("tr", attrs);
    tr.appendChild(el("th", {scope: "row"}, label));
    ["compute", "comm", "idle"].forEach(function (k) {
      tr.appendChild(el("td", {"data-value": split[k], "class": k},
                        fmtTime(split[k]) + " (" + pct(split[k] / T) + ")"));
    });
    tbody.appendChild(tr);
  }
  sc.rows.forEach(function (r) {
    if (r.split) line(rankLabel(r), r.split, {"data-rank": r.rank});
  });
  var avg = {compute: n.compute_share * T, comm: n.comm_share * T, idle: n.idle_share * T};
  line(sc.source === "planner" ? "the slowest pipeline rank (planner)"
                               : "average of the rows (the shares above)", avg,
       {"class": "average"});
  t.appendChild(thead);
  t.appendChild(tbody);
}

// the scenarios in the page that differ from sc only in the schedule (and chunks)
function scheduleSiblings(sc) {
  var s = sc.scenario, order = DATA.controls.schedule;
  return Object.keys(DATA.scenarios).map(function (k) { return DATA.scenarios[k]; })
    .filter(function (o) {
      var t = o.scenario;
      return ["model", "dp", "tp", "pp", "microbatches", "zero", "recompute"].every(
        function (f) { return t[f] === s[f]; });
    })
    .sort(function (a, b) {
      return order.indexOf(a.scenario.schedule) - order.indexOf(b.scenario.schedule) ||
             a.scenario.chunks - b.scenario.chunks;
    });
}

// where the page holds several schedules of one layout: "tiny 2x2x2 m4, ..."
function layoutsWithSchedules() {
  var count = {};
  Object.keys(DATA.scenarios).forEach(function (k) {
    var t = DATA.scenarios[k].scenario;
    var name = t.model + " " + t.dp + "x" + t.tp + "x" + t.pp + " m" + t.microbatches +
      (t.zero ? " ZeRO-" + t.zero : "") + (t.recompute !== "none" ? " " + t.recompute : "");
    count[name] = (count[name] || 0) + 1;
  });
  return Object.keys(count).filter(function (k) { return count[k] > 1; });
}

function drawSchedules(sc) {
  var box = $("perf-schedules"), R = rem(), s = sc.scenario;
  box.innerHTML = "";
  var sibs = scheduleSiblings(sc), T = 0;
  sibs.forEach(function (o) { T = Math.max(T, o.numbers.step_time); });
  if (s.pp === 1) {
    box.appendChild(el("p", {"class": "note"}, "pp = 1 runs no pipeline: there is no " +
                                                "schedule to compare."));
    return;
  }
  if (sibs.length < 2) {
    box.appendChild(el("p", {"class": "note"}, "Only this schedule of this layout is in " +
      "the page; minipar demo --serve computes the others. The page holds several " +
      "schedules for: " + layoutsWithSchedules().join(", ") + "."));
  }
  var grid = el("div", {"class": "schedule-grid"});
  box.appendChild(grid);
  sibs.forEach(function (o) {
    var t = o.scenario, here = t.key === s.key, fig = el("figure", {"class": here ?
      "schedule current" : "schedule", "data-schedule": t.schedule});
    var cap = el("figcaption");
    cap.appendChild(el("strong", {}, SCHEDULE_NAMES[t.schedule] || t.schedule));
    cap.appendChild(document.createTextNode(": step " + fmtTime(o.numbers.step_time) +
      ", idle " + pct(o.numbers.idle_share) + ", peak " + fmtBytes(o.numbers.peak_memory) +
      (here ? " (drawn above)" : " ")));
    if (!here) {
      var b = el("button", {type: "button"}, "draw it");
      b.addEventListener("click", function () {  // the button goes: focus its control
        setValues(applyControl(SC.values, "schedule", t.schedule));
        $("sc-schedule").focus();
      });
      cap.appendChild(b);
    }
    fig.appendChild(cap);
    grid.appendChild(fig);
    if (!o.rows.length || !o.rows[0].cells) {
      fig.appendChild(el("p", {"class": "note"}, "no timeline (" + o.source + ")"));
      return;
    }
    var rowH = Math.max(0.75 * R, Math.min(1.3 * R, 7 * R / o.rows.length));
    fig.appendChild(timelineSvg(o, {width: widthOf(fig), rowH: rowH, font: 0.7 * R,
      labelW: 3.6 * R, T: T, axis: false, title: (SCHEDULE_NAMES[t.schedule] ||
      t.schedule) + " timeline, on the same time scale as the others",
      label: function (r) { return "rank " + r.rank; }}));
  });
}

function drawPerformance(sc) {
  var box = $("perf-timeline"), R = rem(), notes = [];
  if (sc.scenario.model === "tiny") {
    notes.push("The tiny model's real runs are latency-bound: its matmuls take " +
      "nanoseconds and its collectives microseconds, so its timelines are almost all " +
      "communication. Pick the 70B model for realistic proportions.");
  }
  if (sc.source === "dry-run") {
    notes.push("The dry run draws one rank a pipeline stage; its tp and dp peers do the " +
               "same at the same times.");
  }
  if (sc.source === "planner") {
    notes.push("The planner gives the step's time and its shares, not a timeline: none " +
               "is drawn for ZeRO on the 70B (ZeRO 0 shows the dry run's).");
  } else {
    notes.push(ACTION_TEXT);
  }
  $("perf-note").textContent = notes.join(" ");
  drawPerfLegend();
  box.innerHTML = "";
  if (sc.source !== "planner") {
    var font = 0.8 * R, longest = Math.max.apply(null, sc.rows.map(function (r) {
      return rankLabel(r).length; }));
    box.appendChild(timelineSvg(sc, {width: widthOf(box), rowH: 1.7 * R, font: font,
      labelW: longest * font * 0.55 + 10, axis: true, label: rankLabel,
      title: "each drawn rank's timeline: compute, communication, both, idle, with the " +
             "pipeline's actions outlined; the table below gives the numbers"}));
  }
  drawPerfTable(sc);
  drawSchedules(sc);
}

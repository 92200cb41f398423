// minipar demo, data mode: one global batch's journey. The batch cut into micro-batches and
// over dp replicas (the runner's own split), the pipeline's stages with their ranks, and the
// trace read as steps in time order (demo_rows.journey): each pipeline action with the
// collectives and sends inside it, then the step's tail; a stepper walks through them.
var DM = {key: null, index: 0, timer: null};
var KIND_NAMES = {F: "F (forward)", B: "B (backward)", I: "I (backward for the input)",
                  W: "W (backward for the weights)",
                  "&": "F&B (a forward and a backward overlapped)"};
var GROUP_NAMES = {tp: "over tp", dp: "over dp", pp: "over pp",
                   mp: "over mp (the model-parallel ranks, tp x pp)",
                   world: "over all ranks", p2p: "point to point", other: "over another group"};

function dpColour(d) { return PALETTE[d % PALETTE.length]; }

// "8 all-gathers", "1 send"
function collName(name, count) { return plural(count, name.replace(/_/g, "-")); }

// "a, b and c"
function andList(xs) {
  return xs.length < 2 ? xs.join("") : xs.slice(0, -1).join(", ") + " and " + xs[xs.length - 1];
}

// "stage 2 (pp stage 0, its chunk 1)" when a rank holds several stages, else "stage 2"
function stageName(s, stage) {
  if (s.chunks === 1) return "stage " + stage;
  return "stage " + stage + " (pp stage " + stage % s.pp + ", its chunk " +
         Math.floor(stage / s.pp) + ")";
}

// "sequences 4, 5 on dp replica 0; 6, 7 on dp replica 1"
function sequencesText(sc, mb) {
  var blocks = sc.batch.blocks, dp = blocks.length;
  function one(d, first) {
    var q = blocks[d][mb];
    return (first ? (q.length === 1 ? "sequence " : "sequences ") : "") + rangesText(q) +
           " on dp replica " + d;
  }
  if (dp <= 3) return blocks.map(function (_, d) { return one(d, d === 0); }).join("; ");
  return one(0, true) + "; " + one(1, false) + "; ...; " + one(dp - 1, false);
}

// what an action's collectives and sends are, grouped by group and size
function collectivesText(sc, step) {
  var s = sc.scenario, parts = [], byGroup = {}, order = [];
  step.collectives.forEach(function (c) {
    if (c.group === "p2p") return;
    var k = c.group + "|" + c.bytes;
    if (!byGroup[k]) { byGroup[k] = {group: c.group, bytes: c.bytes, items: []}; order.push(k); }
    byGroup[k].items.push(c);
  });
  order.forEach(function (k) {
    var g = byGroup[k], many = g.items.length > 1 || g.items[0].count > 1;
    parts.push(andList(g.items.map(function (c) { return collName(c.name, c.count); })) +
               " " + GROUP_NAMES[g.group] + " (" + fmtBytes(g.bytes) + (many ? " each" : "") +
               ")");
  });
  step.collectives.forEach(function (c) {
    if (c.group !== "p2p") return;
    var to = step.kind === "F" || step.kind === "&" ? step.stage + 1
           : step.kind === "B" || step.kind === "I" ? step.stage - 1 : -1;
    var where = to >= 0 && to < s.pp * s.chunks ? " to stage " + to : "";
    parts.push(collName(c.name, c.count) + where + " (" + fmtBytes(c.bytes) +
               (c.count > 1 ? " each" : "") + ")");
  });
  return parts.join(", ");
}

// a tail step (after the pipeline's last action, or the whole step when pp = 1)
function tailText(sc, j) {
  var s = sc.scenario, size = plural(j.count, j.name === "all_reduce" ? "bucket" :
      j.name.replace(/_/g, "-")) + ", " + fmtBytes(j.bytes) + (j.count > 1 ? " in all" : "");
  var what;
  if (j.group === "dp" && j.name === "all_reduce") {
    what = (s.zero ? "" : "DDP ") + "all-reduces the gradients over dp (" + size + ")";
  } else if (j.group === "dp" && j.name === "reduce_scatter") {
    what = "ZeRO-" + s.zero + " reduce-scatters the gradients over dp, each rank keeping " +
           "its 1/" + s.dp + " (" + size + ")";
  } else if (j.group === "dp" && j.name === "all_gather") {
    what = "ZeRO-" + s.zero + (s.zero === 3 ? " all-gathers each layer's parameters over " +
           "dp before it runs (" : " all-gathers the updated parameter shards over dp (") +
           size + ")";
  } else if (j.group === "pp" && j.name === "broadcast") {
    what = "the last stage broadcasts the loss over pp (" + fmtBytes(j.bytes) + ")";
  } else {
    what = collName(j.name, j.count) + " " + GROUP_NAMES[j.group] + " (" +
           fmtBytes(j.bytes) + (j.count > 1 ? " in all" : "") + ")";
  }
  var when = s.pp === 1 ? "no pipeline (pp = 1), so the step is not cut into actions; " +
                          "over the whole step, " : "the step's tail: ";
  return when + what + " on ranks " + rangesText(allRanks(sc, j.ranks));
}

function stepText(sc, i) {
  var J = sc.journey, j = J[i];
  var head = "step " + (i + 1) + " of " + J.length + ", t = " + fmtTime(j.start) + ": ";
  if (j.kind === "tail") return head + tailText(sc, j);
  var colls = collectivesText(sc, j);
  return head + stageName(sc.scenario, j.stage) + " runs " + (KIND_NAMES[j.kind] || j.kind) +
    " of micro-batch " + j.microbatch + " on ranks " + rangesText(allRanks(sc, j.ranks)) +
    (sc.every_rank ? "" : " (rank " + j.ranks.join(", ") + " drawn)") + " (" +
    sequencesText(sc, j.microbatch) + "): " + (colls || "no communication inside it");
}

function drawBatch(sc) {
  var b = sc.batch, dp = b.blocks.length, m = b.microbatches, per = b.blocks[0][0].length;
  $("data-batch-text").textContent = b.global_batch + " sequences of " +
    thousands(b.seq_len) + " tokens → " + dp + " dp blocks of " + b.global_batch / dp +
    " → " + (m === 1 ? "1 micro-batch" : m + " micro-batches") + " of " + per + " each" +
    (m === 1 ? " (pp = 1: no pipeline)" : "") + ". Micro-batch j of every dp replica is " +
    "its share of the batch's j-th slice: the runner cuts micro-batches first, then each " +
    "over dp. Colours and labels: the dp replica.";
  var box = $("data-batch");
  box.innerHTML = "";
  for (var j = 0; j < m; j++) {
    var row = el("div", {"class": "mb-row", "data-mb": j});
    row.appendChild(el("span", {"class": "mb-label"}, "micro-batch " + j));
    var blocks = el("div", {"class": "blocks"});
    for (var d = 0; d < dp; d++) {
      var blk = el("span", {"class": "blk", "data-dp": d});
      blk.style.borderColor = dpColour(d);
      blk.appendChild(el("span", {"class": "blk-label"}, "dp " + d));
      b.blocks[d][j].forEach(function (q) {
        var cell = el("span", {"class": "seq", title: "sequence " + q + ": dp replica " + d +
                               ", micro-batch " + j}, String(q));
        cell.style.background = dpColour(d) + "40";
        blk.appendChild(cell);
      });
      blocks.appendChild(blk);
    }
    row.appendChild(blocks);
    box.appendChild(row);
  }
  var s = sc.scenario, mdl = sc.model;
  $("data-tp").textContent = s.tp === 1
    ? "tp = 1: inside a stage each rank holds whole weight matrices (all " + mdl.heads +
      " heads) and whole sequences."
    : "Inside a stage the " + s.tp + " tp ranks each hold 1/" + s.tp + " of every weight " +
      "matrix (" + mdl.heads / s.tp + " of the " + mdl.heads + " heads each)" +
      (sc.sequence_parallel ? " and, with sequence parallelism, " + mdl.seq_len / s.tp +
       " of each sequence's " + thousands(mdl.seq_len) + " tokens between blocks " +
       "(all-gathered before the attention and the MLP, reduce-scattered after)." : ".");
}

function drawPipeline(sc) {
  var s = sc.scenario, box = $("data-pipeline");
  box.innerHTML = "";
  $("data-pipeline-text").textContent = "Ranks are coloured by dp replica, as the batch. " +
    (sc.every_rank ? "" : "The dry run draws one rank a stage; its tp and dp peers, lit " +
     "with it, do the same work at the same times. ") +
    (s.chunks > 1 ? "Interleaved: each pp stage holds " + s.chunks + " chunks of layers " +
     "(stages p, p + " + s.pp + ", ...)." : "");
  for (var p = 0; p < s.pp; p++) {
    if (p > 0) box.appendChild(el("span", {"class": "arrow", "aria-hidden": "true"}, "→"));
    var st = el("div", {"class": "stage", "data-stage": p});
    var virt = [];
    for (var c = 0; c < s.chunks; c++) virt.push(p + c * s.pp);
    st.appendChild(el("h3", {}, "stage " + p + (s.chunks > 1 ? " (holds stages " +
                                               andList(virt.map(String)) + ")" : "")));
    st.appendChild(el("p", {"class": "stage-now"}, ""));
    var chips = el("div", {"class": "chips"});
    stageRanks(s, p).forEach(function (r) {
      var d = Math.floor(r / s.tp) % s.dp;
      var chip = el("span", {"class": "chip", "data-rank": r,
                             title: "rank " + r + ": dp replica " + d + ", tp index " +
                                    r % s.tp}, String(r));
      chip.style.borderColor = dpColour(d);
      chip.style.background = dpColour(d) + "40";
      chips.appendChild(chip);
    });
    st.appendChild(chips);
    box.appendChild(st);
  }
}

// what stage p is doing at time t (the current step's action when it is p's)
function nowOn(sc, p, t, current) {
  var s = sc.scenario;
  if (current.kind !== "tail" && current.stage % s.pp === p) return current;
  return sc.journey.filter(function (j) {
    return j.kind !== "tail" && j.stage % s.pp === p && j.start <= t && t < j.end;
  })[0] || null;
}

function renderStep(sc) {
  var J = sc.journey, n = J.length, s = sc.scenario;
  $("step-prev").disabled = DM.index <= 0;
  $("step-next").disabled = DM.index >= n - 1;
  $("step-slider").disabled = $("step-play").disabled = n === 0;
  $("step-slider").max = String(Math.max(1, n));
  $("step-slider").value = String(DM.index + 1);
  if (n === 0) {
    $("data-pipeline").classList.remove("has-step");
    $("step-text").textContent = sc.source === "planner"
      ? "The planner gives no trace, so there is no journey to step through here (ZeRO 0 " +
        "shows the dry run's)."
      : "This run has no pipeline action and no collective to step through (one GPU).";
    return;
  }
  var j = J[DM.index], lit = {};
  allRanks(sc, j.ranks).forEach(function (r) { lit[r] = 1; });
  $("step-text").textContent = stepText(sc, DM.index);
  $("data-pipeline").classList.add("has-step");
  Array.prototype.forEach.call(document.querySelectorAll("#data-pipeline .chip"), function (c) {
    c.classList.toggle("lit", !!lit[c.dataset.rank]);
  });
  Array.prototype.forEach.call(document.querySelectorAll("#data-pipeline .stage"),
    function (box) {
      var p = Number(box.dataset.stage), a = nowOn(sc, p, j.start, j);
      var here = j.kind === "tail" ? stageRanks(s, p).some(function (r) { return lit[r]; })
                                   : j.stage % s.pp === p;
      box.classList.toggle("current", here);
      box.querySelector(".stage-now").textContent = a
        ? (a === j ? "now: " : "also running: ") + a.kind + " of micro-batch " + a.microbatch +
          (s.chunks > 1 ? " (stage " + a.stage + ")" : "")
        : here ? "now: " + j.name.replace(/_/g, "-") + " " + GROUP_NAMES[j.group]
        : "idle or waiting at this moment";
    });
  Array.prototype.forEach.call(document.querySelectorAll("#data-batch .mb-row"), function (r) {
    r.classList.toggle("current", j.kind !== "tail" && Number(r.dataset.mb) === j.microbatch);
  });
}

function stopPlaying() {
  if (DM.timer) clearInterval(DM.timer);
  DM.timer = null;
  $("step-play").textContent = "Play";
}

function goToStep(i) {
  var sc = SC.scenario;
  if (!sc || !sc.journey.length) return;
  DM.index = Math.max(0, Math.min(sc.journey.length - 1, i));
  renderStep(sc);
}

function drawData(sc) {
  if (DM.key !== sc.scenario.key) {
    DM.key = sc.scenario.key;
    DM.index = 0;
    stopPlaying();
  }
  drawBatch(sc);
  drawPipeline(sc);
  renderStep(sc);
}

function setUpData() {
  $("step-prev").addEventListener("click", function () { goToStep(DM.index - 1); });
  $("step-next").addEventListener("click", function () { goToStep(DM.index + 1); });
  $("step-slider").addEventListener("input", function () {
    goToStep(Number($("step-slider").value) - 1);
  });
  $("step-play").addEventListener("click", function () {
    var sc = SC.scenario;
    if (DM.timer) return stopPlaying();
    if (!sc || !sc.journey.length) return;
    if (DM.index >= sc.journey.length - 1) goToStep(0);
    var slow = window.matchMedia && matchMedia("(prefers-reduced-motion: reduce)").matches;
    DM.timer = setInterval(function () {
      if (!SC.scenario || DM.index >= SC.scenario.journey.length - 1) return stopPlaying();
      goToStep(DM.index + 1);
    }, slow ? 2500 : 1200);
    $("step-play").textContent = "Pause";
  });
}

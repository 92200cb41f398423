// minipar demo, the scenario controls shared by the data, state and performance modes, and
// what every scenario shows above its mode: where it comes from and its numbers.
// A setting of the controls is a key (demo_scenario.Scenario.key); the page draws the
// embedded scenario of that key, or asks the server (minipar demo --serve), or says why not.
var SC = {values: null, scenario: null, pending: null};
var SOURCE_BADGE = {run: "real run", "dry-run": "dry run", planner: "planner"};
var CONTROL_NAMES = {model: "model", layout: "layout", dp: "DP", tp: "TP", pp: "PP",
                     microbatches: "micro-batches", schedule: "schedule", chunks: "chunks",
                     zero: "ZeRO", recompute: "recompute"};

// the selects show the values. An option minipar refuses is greyed out (the note below
// the controls says why); one whose scenario is not in the page is marked "*" (from a
// file; the server computes any). Each option names the scenario it leads to (data-key).
function fillControls(v) {
  var refused = {};  // reason -> the options it greys out
  CONTROLS.forEach(function (name) {
    var s = $("sc-" + name), now = name === "layout" ? layoutOf(v) : v[name];
    s.innerHTML = "";
    optionValues(name, v).forEach(function (x) {
      var to = applyControl(v, name, x), key = scenarioKey(to);
      var why = String(x) === String(now) ? "" : refusal(to);
      var known = !why && DATA.scenarios[key];
      var o = el("option", {value: String(x), "data-key": key},
                 optionText(name, x) + (why || known || DATA.served ? "" : " *"));
      if (why) {
        o.disabled = true;
        o.title = why;
        if (!refused[why]) refused[why] = [];
        refused[why].push(CONTROL_NAMES[name] + " " + optionText(name, x));
      }
      s.appendChild(o);
    });
    s.value = String(now);
    s.disabled = (v.pp === 1 && PIPELINE[name]) ||
                 (name === "chunks" && v.schedule !== "interleaved_1f1b");
  });
  $("sc-marks").textContent = (DATA.served
    ? "Served by minipar demo --serve: a setting not in the page is computed on request."
    : "* not in this file (it holds each model's base scenario and every scenario one " +
      "control away from it, and a few more); minipar demo --serve computes any other.") +
    (Object.keys(refused).length ? " Greyed out, as minipar refuses them: " +
     Object.keys(refused).map(function (why) { return refused[why].join(", ") + ": " + why; })
       .join("; ") + "." : "");
}

function setNumber(id, value, text) {
  var e = $(id);
  if (value === null || value === undefined) {
    e.textContent = "–";
    e.removeAttribute("data-value");
  } else {
    e.textContent = text;
    e.setAttribute("data-value", String(value));
  }
}

function drawSource(sc) {
  var line = $("sc-source"), m = sc.model, s = sc.scenario;
  line.innerHTML = "";
  line.appendChild(el("span", {"class": "badge badge-" + sc.source}, SOURCE_BADGE[sc.source]));
  line.appendChild(document.createTextNode(" " + sc.source_text + ". "));
  var parts = [m.name, m.layers + " layers", "hidden " + m.hidden,
               m.seq_len + " tokens a sequence", m.dtype];
  if (m.parameters !== null && m.parameters !== undefined) {
    parts.push(thousands(m.parameters) + " parameters");
  }
  line.appendChild(el("span", {"class": "model"}, "Model: " + parts.join(", ") +
    ". Device: " + sc.device + " (" + fmtBytes(sc.capacity) + "), " + sc.gpus_per_node +
    " GPUs a node; " + s.gpus + " GPUs, " + s.global_batch + " sequences a step" +
    (sc.sequence_parallel ? ", sequence parallelism on." : ".")));
}

function drawNumbers(sc) {
  if (!sc) {
    ["num-step-time", "num-compute", "num-comm", "num-idle", "num-mfu", "num-peak"]
      .forEach(function (id) { setNumber(id, null); });
    $("num-peak-where").textContent = "";
    return;
  }
  var n = sc.numbers;
  setNumber("num-step-time", n.step_time, fmtTime(n.step_time));
  setNumber("num-compute", n.compute_share, pct(n.compute_share));
  setNumber("num-comm", n.comm_share, pct(n.comm_share));
  setNumber("num-idle", n.idle_share, pct(n.idle_share));
  setNumber("num-mfu", n.mfu, mfuText(n.mfu));
  setNumber("num-peak", n.peak_memory, fmtBytes(n.peak_memory));
  var where = "on rank " + n.peak_rank + (sc.every_rank ? "" : " (and its tp and dp peers)");
  var over = n.peak_memory > sc.capacity;
  $("num-peak-where").textContent = where + (over ? ": " : ", ");
  var verdict = el(over ? "strong" : "span", {"class": over ? "over" : "fits"},
                   (over ? "does not fit in " : "fits in ") + fmtBytes(sc.capacity));
  $("num-peak-where").appendChild(verdict);
}

// the drawn scenario: its source, numbers and the current mode's picture
function drawScenario(sc) {
  SC.scenario = sc;
  SC.pending = null;
  $("sc-message").textContent = "";
  ["data-view", "state-view", "perf-view"].forEach(function (id) { $(id).hidden = false; });
  drawSource(sc);
  drawNumbers(sc);
  drawMode();
}

// nothing drawn: no picture may stay under settings it does not show
function clearScenario(text) {
  SC.scenario = null;
  stopPlaying();
  $("sc-source").textContent = "";
  drawNumbers(null);
  ["data-view", "state-view", "perf-view"].forEach(function (id) { $(id).hidden = true; });
  $("sc-message").textContent = text;
}

function showValues(v) {
  var key = scenarioKey(v), sc = DATA.scenarios[key], why = refusal(v);
  if (sc) return drawScenario(sc);
  if (why) {
    SC.pending = null;
    return clearScenario("minipar cannot build " + key + ": " + why);
  }
  if (!DATA.served) {
    SC.pending = null;
    return clearScenario(key + " is not in this file. It holds each model's base scenario " +
      "and every scenario at most one control away from it (the options without *), and " +
      "a few more; run minipar demo --serve to compute any combination, or go back to " +
      "the base.");
  }
  SC.pending = key;
  clearScenario("computing " + key + " on the server ...");
  var query = {};
  FIELDS.forEach(function (k) { query[k] = String(v[k]); });
  fetch("api/scenario?" + new URLSearchParams(query))
    .then(function (r) {
      return r.json().then(function (body) { return {ok: r.ok, status: r.status, body: body}; });
    })
    .then(function (res) {
      if (SC.pending !== key) return;  // the controls moved on meanwhile
      if (res.ok) {
        DATA.scenarios[key] = res.body;
        fillControls(SC.values);
        drawScenario(res.body);
      } else {
        clearScenario("the server cannot build " + key + ": " +
                      (res.body && res.body.error || "status " + res.status));
      }
    })
    .catch(function (err) {
      if (SC.pending === key) clearScenario("could not reach the server for " + key + ": " + err);
    });
}

function setValues(v) {
  SC.values = v;
  fillControls(v);
  showValues(v);
}

function setUpScenario() {
  CONTROLS.forEach(function (name) {
    $("sc-" + name).addEventListener("change", function (e) {
      var raw = e.target.value;
      setValues(applyControl(SC.values, name, NUMERIC[name] ? Number(raw) : raw));
    });
  });
  $("sc-base").addEventListener("click", function () { setValues(baseValues(SC.values.model)); });
  Object.keys(DATA.scenarios).forEach(function (k) {  // the page's key must be minipar's
    var key = scenarioKey(DATA.scenarios[k].scenario);
    if (key !== k) console.error("minipar demo: the page's key " + key + " is not " + k);
  });
  SC.values = baseValues(Object.keys(DATA.base)[0]);
  fillControls(SC.values);
  var sc = DATA.scenarios[scenarioKey(SC.values)];
  SC.scenario = sc;
  drawSource(sc);
  drawNumbers(sc);
}

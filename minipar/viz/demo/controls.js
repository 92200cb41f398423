// minipar demo, the scenario controls' rules: what each control offers, where a choice
// leads (the scenario's key, as demo_scenario.Scenario.key writes it) and why minipar
// refuses some (demo_scenario.check's words).
var FIELDS = ["model", "dp", "tp", "pp", "microbatches", "schedule", "chunks", "zero",
              "recompute"];
// the selects: a scenario's fields, and the layout (dp, tp and pp at once: the seed's)
var CONTROLS = ["model", "layout"].concat(FIELDS.slice(1));
var NUMERIC = {dp: 1, tp: 1, pp: 1, microbatches: 1, chunks: 1, zero: 1};
var PIPELINE = {microbatches: 1, schedule: 1, chunks: 1};
var SCHEDULE_NAMES = {gpipe: "GPipe", "1f1b": "1F1B", interleaved_1f1b: "interleaved 1F1B",
                      zb_h1: "ZB-H1 (zero bubble)"};
var ZERO_NAMES = ["0 (DDP)", "1 (optimizer states)", "2 (+ gradients)", "3 (+ parameters)"];

// 'tiny/2x2x2/1f1b/m4/v1/z0/none', as Scenario.key writes it
function scenarioKey(v) {
  return v.model + "/" + v.dp + "x" + v.tp + "x" + v.pp + "/" + v.schedule + "/m" +
         v.microbatches + "/v" + v.chunks + "/z" + v.zero + "/" + v.recompute;
}

// the control values of a model's base scenario (the page opens on it)
function baseValues(model) {
  var s = DATA.scenarios[DATA.base[model]].scenario, v = {};
  FIELDS.forEach(function (k) { v[k] = s[k]; });
  return v;
}

function layoutOf(v) { return v.dp + "x" + v.tp + "x" + v.pp; }

// the values after setting one control, with the rules the controls follow: a new model
// opens on its base; a layout sets dp, tp and pp; pp = 1 runs no pipeline (1 micro-batch,
// 1 chunk, "1f1b"), and the pipeline settings come back when pp > 1 again; interleaved
// 1F1B takes 2 chunks, the other schedules 1
function applyControl(v, name, value) {
  if (name === "model") return baseValues(value);
  if (name === "layout") {
    var d = value.split("x").map(Number);
    return applyControl(applyControl(applyControl(v, "dp", d[0]), "tp", d[1]), "pp", d[2]);
  }
  var out = Object.assign({}, v);
  out[name] = value;
  if (name === "pp" && value === 1 && v.pp > 1) {
    out.pipe = {microbatches: v.microbatches, schedule: v.schedule, chunks: v.chunks};
    out.microbatches = 1; out.schedule = "1f1b"; out.chunks = 1;
  } else if (name === "pp" && value > 1 && v.pp === 1) {
    var p = v.pipe || baseValues(v.model);
    out.microbatches = p.microbatches; out.schedule = p.schedule; out.chunks = p.chunks;
  }
  if (name === "schedule") out.chunks = value === "interleaved_1f1b" ? 2 : 1;
  return out;
}

// why minipar refuses these values (demo_scenario.check's words, and the schedule's), or ""
function refusal(v) {
  var base = DATA.scenarios[DATA.base[v.model]], heads = base.model.heads;
  var layers = base.model.layers, stages = v.pp * v.chunks, gpus = v.dp * v.tp * v.pp;
  var batch = base.scenario.global_batch, max = DATA.controls.max_run_gpus;
  if (v.zero && v.dp === 1) {
    return "ZeRO-" + v.zero + " shards over the dp group, which is 1: give dp > 1";
  }
  if ((v.chunks > 1) !== (v.schedule === "interleaved_1f1b")) {
    return "chunks = " + v.chunks + " with schedule " + v.schedule + ": the interleaved " +
           "1F1B takes chunks >= 2, the others chunks = 1";
  }
  if (heads % v.tp) return "tp = " + v.tp + " does not divide the " + heads + " attention heads";
  if (layers < stages) return "pp x chunks = " + stages + " stages but only " + layers + " layers";
  if (v.model === "70b" && v.zero && layers % stages) {
    return "ZeRO on the 70B comes from the planner, which splits the " + layers + " layers " +
           "evenly: pp x chunks = " + stages + " does not divide them (pick pp 2 or 4)";
  }
  if (v.model === "tiny" && gpus > max) {
    return gpus + " GPUs: the tiny model is executed, on at most " + max + "; pick the 70B " +
           "model for larger layouts";
  }
  if (v.model === "tiny" && batch % (v.dp * (v.pp > 1 ? v.microbatches : 1))) {
    return "the tiny model's " + batch + " sequences do not split into dp = " + v.dp + " x " +
           v.microbatches + " micro-batches";
  }
  if (v.pp > 1 && v.schedule === "interleaved_1f1b" && v.microbatches % v.pp) {
    var lower = Math.floor(v.microbatches / v.pp) * v.pp, upper = lower + v.pp;
    return "interleaved_1f1b groups micro-batches by the pipeline size (Megatron's rule): " +
           "microbatches must be a multiple of pp = " + v.pp + ", got " + v.microbatches +
           "; use microbatches = " + (lower ? lower + " or " + upper : upper) +
           ", or chunks=1 with '1f1b'";
  }
  if (v.pp === 1 && (v.schedule !== "1f1b" || v.microbatches !== 1 || v.chunks !== 1)) {
    return "pp = 1 runs no pipeline: give microbatches = 1, chunks = 1 and the schedule " +
           "'1f1b' (the page's controls do)";
  }
  return "";
}

function optionText(name, x) {
  if (name === "model") return DATA.controls.models[x] || x;
  if (name === "layout") return x.replace(/^(\d+)x(\d+)x(\d+)$/, "DP $1 x TP $2 x PP $3");
  if (name === "schedule") return SCHEDULE_NAMES[x] || x;
  if (name === "zero") return ZERO_NAMES[x] || String(x);
  return String(x);
}

// what a control offers for the current values: DATA.controls (per model where it is per
// model), every value an embedded scenario of the model uses, and the current one
function optionValues(name, v) {
  if (name === "model") return Object.keys(DATA.controls.models);
  if (name === "layout") {
    var seeds = DATA.controls.seed_layouts[v.model].map(function (d) { return d.join("x"); });
    return seeds.indexOf(layoutOf(v)) < 0 ? seeds.concat([layoutOf(v)]) : seeds;
  }
  if (v.pp === 1 && PIPELINE[name]) return [v[name]];
  if (name === "chunks" && v.schedule !== "interleaved_1f1b") return [1];
  var c = DATA.controls[name], vals = (Array.isArray(c) ? c : c[v.model]).slice();
  Object.keys(DATA.scenarios).forEach(function (k) {
    var s = DATA.scenarios[k].scenario;
    if (s.model === v.model && (!PIPELINE[name] || s.pp > 1)) vals.push(s[name]);
  });
  vals.push(v[name]);
  if (name === "chunks") vals = vals.filter(function (x) { return x >= 2; });
  var seen = {}, out = vals.filter(function (x) {
    var k = String(x);
    return seen[k] ? false : (seen[k] = true);
  });
  if (NUMERIC[name]) out.sort(function (a, b) { return a - b; });
  return out;
}


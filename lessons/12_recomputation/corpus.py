"""Lesson 12's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 4) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
T = line("t = tp")
SPLIT = line("split = t if sequence_parallel else 1  # what sequence parallelism divides: the stream")
FULL = line("return 2 * sbh / split  # the layer's input alone", 8)
MASKS = line("masks = 2 if dropout else 0  # the two residual dropouts' masks, 1 byte an element")
INSIDE = line("inside = 24 * sbh / t  # Q, K, V (6), the projection's input (2), GeLU's and fc2's (16)")
SELECTIVE = line('if recompute == "selective":')
CORE = line("core = (5 if dropout else 2) * a * s * s * b / t  # softmax, its mask, dropped: by heads")
BODY_12_1 = (T + SPLIT + line("sbh = s * b * h") + line('if recompute == "full":') + FULL
             + MASKS + line("between = (8 + masks) * sbh / split  # two LayerNorm inputs, the QKV and fc1 inputs")
             + INSIDE + SELECTIVE + line("return between + inside", 8) + CORE
             + line("return between + inside + core"))

PEAK = line("return float(max(m * kept + size * layer for m, size in enumerate(sizes)))")
BEST = (line("return min(range(1, num_layers + 1),")
        + line("key=lambda k: (segments_peak(num_layers, k, layer, kept), k))", 15))

HFU = line("return mfu * (model + extra) / model")
EXTRA = line('extra = {"none": 0.0, "selective": core, "full": 24 * B * s * h * h * l + core}[recompute]')

MODES = line('for mode in ("none", "selective"):  # no extra FLOPs, then Q Kᵀ again: measure both')
SEGMENTS = line('return {"recompute": "segments", "recompute_segment": best_segment(cfg.num_layers, A, I)}')


WRONG = [
    # 12.1 a layer's activation bytes per rank and mode
    wrong("12.1", "misconception", "only the attention scores divided by t",
          old=INSIDE, new=line("inside = 24 * sbh  # Q, K, V, the projection's, GeLU's, fc2's"),
          hint=["you divided only the attention scores by t", "24sbh in all"]),
    wrong("12.1", "misconception", "everything divided by t, sequence parallelism or not",
          old=SPLIT, new=line("split = t"),
          hint=["without sequence parallelism", "whole on every tp rank"]),
    wrong("12.1", "misconception", "sequence parallelism left out: the 10sbh never split",
          old=SPLIT, new=line("split = 1"),
          hint=["sequence parallelism also splits the 10sbh between the blocks"]),
    wrong("12.1", "misconception", "34sbh without dropout: the masks counted anyway",
          old=MASKS, new=line("masks = 2  # the two residual dropouts' masks"),
          hint=["without dropout there are no dropout masks", "32sbh"]),
    wrong("12.1", "misconception", "sbh(34 + 5as/h) whether the layer drops out or not",
          edits=[(MASKS, line("masks = 2  # the two residual dropouts' masks")),
                 (CORE, line("core = 5 * a * s * s * b / t  # softmax, its mask, dropped"))],
          hint=["without dropout a layer keeps no masks", "32sbh + 2as²b"]),
    wrong("12.1", "misconception", "selective recomputation keeps the scores too",
          old=SELECTIVE, new=line('if recompute == "never":'),
          hint=["selective recomputation drops exactly the attention core's s² tensors"]),
    wrong("12.1", "misconception", "full recomputation's input divided by t without SP",
          old=FULL, new=line("return 2 * sbh / t  # the layer's input, split", 8),
          hint=["full recomputation keeps the layer's input, which is whole on every tp rank"]),
    wrong("12.1", "misconception", "the attention scores kept whole on every tp rank",
          old=CORE, new=line("core = (5 if dropout else 2) * a * s * s * b  # every head's"),
          hint=["the attention core is split by heads"]),
    wrong("12.1", "small-only", "one device's count: right at tp = 1",
          old=T, new=line("t = 1"),
          hint=["you returned one device's count"]),
    # 12.2 checkpoint segments' peak and the best segment size
    wrong("12.2", "misconception", "the k·A of the segment being recomputed forgotten",
          old=PEAK, new=line("return float((len(sizes) - 1) * kept)"),
          hint=["you forgot the k·A of the segment being recomputed"]),
    wrong("12.2", "misconception", "L/k inputs kept at the peak, the rerun segment's included",
          old=PEAK, new=line("return float(len(sizes) * kept + sizes[0] * layer)"),
          hint=["the rerun segment's own input is inside its first layer's A"]),
    wrong("12.2", "small-only", "(L/k − 1)·I + k·A everywhere: right when k divides L",
          old=PEAK, new=line("return float((num_layers / k - 1) * kept + k * layer)"),
          hint=["when k does not divide L the last segment is shorter"]),
    wrong("12.2", "misconception", "Chen et al.'s √L as the best segment",
          old=BEST, new=line("return max(1, min(num_layers, round(num_layers ** 0.5)))"),
          hint=["Chen et al.'s √L is the best segment only for a chain"]),
    wrong("12.2", "misconception", "√(L·I/A) rounded to the nearest integer",
          old=BEST,
          new=line("return max(1, min(num_layers, round((num_layers * kept / layer) ** 0.5)))"),
          hint=["rounding √(L·I/A) is not enough"]),
    wrong("12.2", "small-only", "segments of 1 always: right while L ≤ 2A/I",
          old=BEST, new=line("return 1"),
          hint=["segments of 1 (full recomputation) are best only while L ≤ 2A/I"]),
    # 12.3 HFU from MFU
    wrong("12.3", "misconception", "HFU given as the MFU: the recomputation not counted",
          old=HFU, new=line("return mfu"),
          hint=["you returned the MFU"]),
    wrong("12.3", "misconception", "HFU = MFU × model / (model + recomputed)",
          old=HFU, new=line("return mfu * model / (model + extra)"),
          hint=["HFU is at least the MFU"]),
    wrong("12.3", "misconception", "full recomputation as exactly 4/3",
          old=HFU, new=line('return mfu * 4 / 3 if recompute == "full" else mfu * (model + extra) / model'),
          hint=["the logits layer is not rerun"]),
    wrong("12.3", "misconception", "selective recomputation counted as Q Kᵀ alone",
          old=EXTRA,
          new=line('extra = {"none": 0.0, "selective": core / 2, "full": 24 * B * s * h * h * l + core}[recompute]'),
          hint=["reruns the whole attention core", "4Bs²h a layer"]),
    wrong("12.3", "misconception", "full recomputation without the s² matmuls",
          old=EXTRA,
          new=line('extra = {"none": 0.0, "selective": core, "full": 24 * B * s * h * h * l}[recompute]'),
          hint=["its two s² matmuls"]),
    wrong("12.3", "small-only", "selective recomputation taken as free: right while s ≪ h",
          old=EXTRA,
          new=line('extra = {"none": 0.0, "selective": 0.0, "full": 24 * B * s * h * h * l + core}[recompute]'),
          hint=["selective recomputation is not free", "s/(18h)"]),
    # 12.4 the cheapest recomputation within a memory budget
    wrong("12.4", "misconception", "full recomputation whatever the budget",
          old=MODES, new=line('return {"recompute": "full"}') + MODES,
          hint=["which fits the budget too", "Recompute only what the budget needs"]),
    wrong("12.4", "misconception", "selective recomputation whenever none does not fit",
          edits=[(MODES, line('for mode in ("none",):  # no extra FLOPs')),
                 (SEGMENTS, line('return {"recompute": "selective"}'))],
          hint=["selective recomputation still keeps 32sbh a layer", "does not fit this budget"]),
    wrong("12.4", "misconception", "segments of Chen et al.'s √L layers",
          old=SEGMENTS,
          new=line('return {"recompute": "segments", "recompute_segment": round(cfg.num_layers ** 0.5)}'),
          hint=["Chen et al.'s √L", "The k with the smallest peak is 2"]),
    wrong("12.4", "misconception", "segments of 2, incident C's \"groups of 2 layers\"",
          old=SEGMENTS, new=line('return {"recompute": "segments", "recompute_segment": 2}'),
          hint=["segments of 2 hold", "The k with the smallest peak is 3"]),
    wrong("12.4", "misconception", "one segment of all the layers: the k·A forgotten",
          old=SEGMENTS,
          new=line('return {"recompute": "segments", "recompute_segment": cfg.num_layers}'),
          hint=["one segment of all 6 layers reruns them all at once"]),
    wrong("12.4", "small-only", "full recomputation whenever selective does not fit: right "
          "while L ≤ 2A/I",
          old=SEGMENTS, new=line('return {"recompute": "full"}'),
          hint=["The k with the smallest peak is 2"]),
]

RIGHT = [
    right("a layer's bytes as Korthikanti et al.'s Table 2 writes them",
          old=BODY_12_1,
          new=(line("t, sbh = tp, s * b * h")
               + line("stream = t if sequence_parallel else 1")
               + line('if recompute == "full":')
               + line("return 2 * sbh / stream", 8)
               + line("linear = (10 if dropout else 8) / stream + 24 / t  # 34/t with SP and dropout")
               + line('scores = 0 if recompute == "selective" else (5 if dropout else 2) * a * s / (h * t)')
               + line("return sbh * (linear + scores)"))),
    right("the backward walked segment by segment, holding what each moment holds",
          old=PEAK,
          new=(line("worst, below = 0.0, 0.0  # the inputs of the segments under this one")
               + line("for size in sizes:")
               + line("worst = max(worst, below + size * layer)", 8)
               + line("below += kept", 8)
               + line("return float(worst)"))),
    right("HFU from the planner's FLOP functions",
          old=HFU,
          new=(line("from minipar.plan import model_flops, model_flops_full_recompute")
               + line("F = model_flops(B, s, l, h, V)")
               + line('hardware = {"none": F, "selective": F + 4 * B * s * s * h * l,')
               + line('"full": model_flops_full_recompute(B, s, l, h, V)}[recompute]', 12)
               + line("return mfu * hardware / F"))),
    right("the segment size from plan.training_memory over every k",
          old=SEGMENTS,
          new=(line("from minipar.plan.training_memory import training_memory")
               + line("peaks = {k: training_memory(cfg.num_parameters(), 1, micro_batch, cfg.seq_len,")
               + line("cfg.num_layers, cfg.hidden, cfg.num_heads, cfg.vocab_size,", 36)
               + line('cfg.dtype, "segments", k).activations', 36)
               + line("for k in range(1, cfg.num_layers + 1)}", 9)
               + line("k = min(peaks, key=lambda k: (peaks[k], k))")
               + line('return {"recompute": "full"} if k == 1 else {"recompute": "segments", "recompute_segment": k}'))),
]

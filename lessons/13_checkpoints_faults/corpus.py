"""Lesson 13's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 4) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
MTBF = line("M = days * 86400 / unexpected  # planned stops are saved before: they lose nothing")
YOUNG = line("young = math.sqrt(2 * d * M)")
BRANCH = line("if d < 2 * M:")
DALY = line("daly = young * (1 + math.sqrt(d / (2 * M)) / 3 + d / (18 * M)) - d", 8)
LOST = line("lost = R + (young + d) / 2")
OVERHEAD = line('"overhead": d / young + lost / M}', 12)

SIZES = line("old, new = -(-numel // n), -(-numel // m)  # shard sizes: ceil(numel / ranks)")
RANGE = line("lo, hi = rank * new, min((rank + 1) * new, numel)")
APPEND = line("reads.append((k, start - k * old, stop - k * old))", 12)
RESHARD_BODY = (SIZES + RANGE + line("reads = []") + line("for k in range(n):")
                + line("start, stop = max(lo, k * old), min(hi, (k + 1) * old)", 8)
                + line("if start < stop:", 8) + APPEND + line("return reads"))

K = line("k = global_batch // (dp_new * micro_batch)  # the largest that fits in the batch")
BATCH = line("batch = dp_new * k * micro_batch")
ROWS = (line("rows = [[(d * block + i * micro_batch, d * block + (i + 1) * micro_batch)")
        + line("for i in range(k)] for d in range(dp_new)]", 13))

HANG_BODY = (line("longest = max((len(calls) for calls in entered), default=0)")
             + line("for i in range(longest):")
             + line("at = [calls[i] if i < len(calls) else None for calls in entered]", 8)
             + line("if len(set(at)) > 1:", 8)
             + line("usual = Counter(at).most_common(1)[0][0]", 12)
             + line("return next(r for r, e in enumerate(at) if e != usual), i", 12)
             + line("return None"))
LONGEST = line("longest = max((len(calls) for calls in entered), default=0)")
BLAME = line("return next(r for r, e in enumerate(at) if e != usual), i", 12)


WRONG = [
    # 13.1 the checkpoint interval and its overhead
    wrong("13.1", "misconception", "Young's interval without the 2: sqrt(δ·M)",
          old=YOUNG, new=line("young = math.sqrt(d * M)"),
          hint=["That is sqrt(δ·M)", "sqrt(2·δ·M)"]),
    wrong("13.1", "misconception", "the MTBF from every interruption, planned ones included",
          old=MTBF, new=line("M = days * 86400 / (planned + unexpected)"),
          hint=["You counted all the interruptions", "planned ones (maintenance)"]),
    wrong("13.1", "misconception", "the MTBF in hours",
          old=MTBF, new=line("M = days * 24 / unexpected"),
          hint=["Your M is in hours"]),
    wrong("13.1", "small-only", "Daly's formula whatever the save time: right while δ < 2M",
          old=BRANCH, new=line("if True:"),
          hint=["Daly's estimate holds while δ < 2M", "the interval is M"]),
    wrong("13.1", "misconception", "Daly's estimate without its − δ",
          old=DALY, new=line("daly = young * (1 + math.sqrt(d / (2 * M)) / 3 + d / (18 * M))", 8),
          hint=["You left out Daly's − δ"]),
    wrong("13.1", "misconception", "a failure loses the whole interval, not half of it",
          old=LOST, new=line("lost = R + young + d"),
          hint=["half a cycle on average", "(τ + δ)/2"]),
    wrong("13.1", "misconception", "the restart left out of a failure's cost",
          old=LOST, new=line("lost = (young + d) / 2"),
          hint=["You left the restart out"]),
    wrong("13.1", "misconception", "the overhead of the saves alone",
          old=OVERHEAD, new=line('"overhead": d / young}', 12),
          hint=["The overhead counts the saves δ/τ and the failures"]),
    # 13.2 which old shards a new rank reads
    wrong("13.2", "small-only", "shards of numel // n: right when n divides numel",
          old=SIZES, new=line("old, new = numel // n, numel // m"),
          hint=["Your shards are numel // n elements", "ceil(numel / n)"]),
    wrong("13.2", "misconception", "the new shard read to its end, padding included",
          old=RANGE, new=line("lo, hi = rank * new, (rank + 1) * new"),
          hint=["You read the padding"]),
    wrong("13.2", "misconception", "offsets in the flat buffer, not inside the old shard",
          old=APPEND, new=line("reads.append((k, start, stop))", 12),
          hint=["offsets in the flat buffer", "inside old rank k's shard"]),
    wrong("13.2", "misconception", "the new shards cut with the old shard size",
          old=SIZES, new=line("old = new = -(-numel // n)"),
          hint=["You cut the new shards with the old shard size"]),
    wrong("13.2", "misconception", "a stop that includes its last element",
          old=APPEND, new=line("reads.append((k, start - k * old, stop - k * old - 1))", 12),
          hint=["Your stop is inclusive"]),
    # 13.3 the accumulation that keeps the global batch
    wrong("13.3", "misconception", "the old accumulation kept: the global batch shrinks",
          old=K, new=line("k = global_batch // (dp_old * micro_batch)"),
          hint=["You kept the accumulation of dp_old", "the global batch shrinks"]),
    wrong("13.3", "misconception", "the batch divided by dp alone, forgetting b",
          old=K, new=line("k = global_batch // dp_new"),
          hint=["You divided the batch by dp alone"]),
    wrong("13.3", "small-only", "the global batch reported unchanged: right when dp_new·b "
          "divides it",
          old=BATCH, new=line("batch = global_batch"),
          hint=["does not divide the global batch", "the largest multiple not above it"]),
    wrong("13.3", "misconception", "replicas take every dp-th micro-batch",
          old=ROWS,
          new=(line("rows = [[((i * dp_new + d) * micro_batch, (i * dp_new + d + 1) * micro_batch)")
               + line("for i in range(k)] for d in range(dp_new)]", 13)),
          hint=["every dp-th micro-batch", "contiguous block"]),
    # 13.4 the first rank to diverge
    wrong("13.4", "misconception", "the rank with the fewest collectives is blamed",
          old=HANG_BODY,
          new=(line("lengths = [len(calls) for calls in entered]")
               + line("if len(set(lengths)) == 1:")
               + line("return None", 8)
               + line("r = lengths.index(min(lengths))")
               + line("return r, lengths[r]")),
          hint=["the fewest collectives", "not calls swapped"]),
    wrong("13.4", "misconception", "the last rank to disagree with rank 0 is blamed",
          old=BLAME, new=line("return max(r for r, e in enumerate(at) if e != at[0]), i", 12),
          hint=["the last rank that disagrees with rank 0", "the one most ranks have"]),
    wrong("13.4", "misconception", "the lists compared up to the shortest only (zip)",
          old=LONGEST, new=line("longest = min((len(calls) for calls in entered), default=0)"),
          hint=["only up to the shortest", "a rank that stopped"]),
    wrong("13.4", "small-only", "the last collective each rank entered compared: right when "
          "the divergence is the last call",
          old=HANG_BODY,
          new=(line("ends = [calls[-1] if calls else None for calls in entered]")
               + line("if len(set(ends)) == 1:")
               + line("return None", 8)
               + line("usual = Counter(ends).most_common(1)[0][0]")
               + line("r = next(r for r, e in enumerate(ends) if e != usual)")
               + line("return r, max(len(entered[r]) - 1, 0)")),
          hint=["You compared only the last collective each rank entered",
                "where the lists part"]),
    wrong("13.4", "misconception", "the index counted from 1",
          old=BLAME, new=line("return next(r for r, e in enumerate(at) if e != usual), i + 1", 12),
          hint=["Your index counts from 1"]),
]

RIGHT = [
    right("the overlaps found from the first and last old shard the new one touches",
          old=RESHARD_BODY,
          new=(SIZES + RANGE
               + line("if lo >= hi:")
               + line("return []", 8)
               + line("return [(k, max(lo, k * old) - k * old, min(hi, (k + 1) * old) - k * old)")
               + line("for k in range(lo // old, (hi - 1) // old + 1)]", 12))),
    right("the lists walked with zip_longest; the rows cut by minipar's own split",
          edits=[(HANG_BODY,
                  line("from itertools import zip_longest")
                  + line("for i, at in enumerate(zip_longest(*entered)):")
                  + line("if len(set(at)) > 1:", 8)
                  + line("usual = max(set(at), key=at.count)", 12)
                  + line("return min(r for r, e in enumerate(at) if e != usual), i", 12)
                  + line("return None")),
                 (ROWS,
                  line("import numpy as np")
                  + line("from minipar.data.batches import split_data_parallel, split_microbatches")
                  + line("cols = np.arange(batch)[None, :]")
                  + line("rows = [[(int(x[0, 0]), int(x[0, -1]) + 1) for x, _ in")
                  + line("split_microbatches(*split_data_parallel(cols, cols, d, dp_new), k)]", 13)
                  + line("for d in range(dp_new)]", 12))]),
]

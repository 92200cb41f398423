"""Lesson 03's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with their hint (`minipar lessons corpus 03`), the right ones pass."""

from minipar.course.corpus import right, wrong

RANKS = "    n, r = mp.get_world_size(group), mp.get_rank(group)\n"
SHARD = "    w = flat_params[r * shard:(r + 1) * shard]  # [padded/n]: the weights this rank owns\n"
SCATTER = ('    g = mp.reduce_scatter(flat_grad, "avg", group=group)  # [padded/n]: their averaged '
           'gradient\n')
GATHER = "    return mp.all_gather(w, group=group), m, v  # [padded], [padded/n], [padded/n]\n"
MOMENTS = ("    m = b1 * m + (1.0 - b1) * g\n"
           "    v = b2 * v + (1.0 - b2) * (g * g)\n")
UPDATE = ("    w = w - lr * weight_decay * w\n"
          "    w = w - lr * m_hat / (np.sqrt(v_hat) + eps)\n")
PADDED_3 = "    full = psi if stage == 0 else psi + (-psi) % n  # Ψ or Ψ'\n"
PADDED_4 = "    full = psi if stage == 0 else psi + (-psi) % n\n    passes"
PASSES = "    passes = 3 if stage == 3 else 2  # ZeRO-3 gathers the weights twice\n"
COUNT = "    return float(passes * full * (n - 1) / n)\n"
PLAN = '    return {"stage": 1, "recompute": "full", "micro_batches": batch}\n'

WRONG = [
    # ---- 3.1: the ZeRO-1 step -------------------------------------------------------------
    wrong("3.1", "misconception", "ignores `group`: the world's rank, size and collectives",
          edits=[(RANKS, "    n, r = mp.get_world_size(), mp.get_rank()\n"),
                 (SCATTER, '    g = mp.reduce_scatter(flat_grad, "avg")\n'),
                 (GATHER, "    return mp.all_gather(w), m, v\n")],
          hint=["not over `group`", "pass group=group to every collective"]),
    wrong("3.1", "misconception", "the group's size but the global rank",
          old=RANKS, new="    n, r = mp.get_world_size(group), mp.get_rank()\n",
          hint=["not its global rank"]),
    wrong("3.1", "misconception", "sums the gradients instead of averaging them",
          old=SCATTER, new='    g = mp.reduce_scatter(flat_grad, "sum", group=group)\n',
          hint=["received = n× (n = 2) expected everywhere", "summed over the group, not averaged"]),
    wrong("3.1", "misconception", "all-reduces the whole gradient, then keeps its shard",
          old=SCATTER, new=('    g = mp.all_reduce(flat_grad, "avg", group=group)'
                            '[r * shard:(r + 1) * shard]\n'),
          hint=["expected ['reduce_scatter', 'all_gather'] but received ['all_reduce', "
                "'all_gather']", "half an all-reduce's bytes"]),
    wrong("3.1", "misconception", "updates the weights in place, in flat_params",
          old=UPDATE, new=("    w -= lr * weight_decay * w\n"
                           "    w -= lr * m_hat / (np.sqrt(v_hat) + eps)\n"),
          hint=["wrote into its input `flat_params`"]),
    wrong("3.1", "misconception", "updates Adam's moments in place",
          old=MOMENTS, new=("    m *= b1\n    m += (1.0 - b1) * g\n"
                            "    v *= b2\n    v += (1.0 - b2) * (g * g)\n"),
          hint=["wrote into its input `m`"]),
    wrong("3.1", "misconception", "ε inside the square root",
          old="    w = w - lr * m_hat / (np.sqrt(v_hat) + eps)\n",
          new="    w = w - lr * m_hat / np.sqrt(v_hat + eps)\n",
          hint=["ε outside the square root"]),
    wrong("3.1", "small-only", "a strided shard, every n-th element: right while a shard is "
          "one element", old=SHARD, new="    w = flat_params[r::n]\n",
          hint=["the shard is contiguous", "flat_params[0:2], the shard this rank updated"]),
    wrong("3.1", "small-only", "the bias correction of the first step only",
          edits=[("    m_hat = m / (1.0 - b1 ** step)\n", "    m_hat = m / (1.0 - b1)\n"),
                 ("    v_hat = v / (1.0 - b2 ** step)\n", "    v_hat = v / (1.0 - b2)\n")],
          hint=["step=2", "bias correction with this step's t"]),
    # ---- 3.2: bytes per rank --------------------------------------------------------------
    wrong("3.2", "misconception", "no padding: shards of Ψ/n",
          old=PADDED_3, new="    full = psi\n", hint=["it counts Ψ = 1 elements", "pads the flat "
                                                   "buffer to Ψ' = 2"]),
    wrong("3.2", "misconception", "ZeRO-2 partitions the weights too (stages off by one)",
          old="    params = param_bytes * (shard if stage >= 3 else full)\n",
          new="    params = param_bytes * (shard if stage >= 2 else full)\n",
          hint=["received = 1/n", "stage 2 keeps the parameters whole, not partitioned"]),
    wrong("3.2", "misconception", "DDP pads too",
          old=PADDED_3, new="    full = psi + (-psi) % n\n",
          hint=["DDP pads nothing: an all-reduce needs no equal shards"]),
    wrong("3.2", "small-only", "pads by Ψ mod n, the complement's sign flipped: right on 2 ranks",
          old=PADDED_3, new="    full = psi if stage == 0 else psi + psi % n\n",
          hint=["n=3", "Ψ' = Ψ + ((−Ψ) mod n)"]),
    # ---- 3.3: traffic ---------------------------------------------------------------------
    wrong("3.3", "misconception", "ZeRO-3 gathers the weights once, like ZeRO-1",
          old=PASSES, new="    passes = 2\n",
          hint=["received = ⅔ expected", "and again for the backward"]),
    wrong("3.3", "misconception", "an all-reduce counted as one pass over the buffer",
          old=PASSES, new="    passes = 2 if stage == 3 else 1\n",
          hint=["received = ½ expected everywhere", "a reduce-scatter plus an all-gather"]),
    wrong("3.3", "misconception", "ZeRO sends the unpadded Ψ",
          old=PADDED_4, new="    full = psi\n    passes",
          hint=["it counts Ψ = 1 elements, but stage 1 pads"]),
    wrong("3.3", "small-only", "1/n of the buffer per pass: right on 2 ranks",
          old=COUNT, new="    return float(passes * full / n)\n",
          hint=["received = 1/(n−1) (n = 3) expected everywhere", "sends (n−1)/n of it", "n=3"]),
    wrong("3.3", "small-only", "pads by Ψ mod n: right on 2 ranks",
          old=PADDED_4, new="    full = psi if stage == 0 else psi + psi % n\n    passes",
          hint=["n=3", "padded Ψ'"]),
    # ---- 3.4: the plan --------------------------------------------------------------------
    wrong("3.4", "misconception", "ZeRO-3 shards everything, so it must fit",
          old=PLAN, new='    return {"stage": 3, "recompute": "full", "micro_batches": batch}\n',
          hint=["the bytes sent in the step", "over its budget", "ZeRO-3 all-gathers each "
                "unit's weights for its forward and again for its backward"]),
    wrong("3.4", "misconception", "ZeRO-2 with micro-batches: it shards the gradients too",
          old=PLAN, new='    return {"stage": 2, "micro_batches": batch}\n',
          hint=["the peak memory", "under no_sync, ZeRO-2 and ZeRO-3 keep every unit's whole "
                "gradient", "where it first went over"]),
    wrong("3.4", "misconception", "DDP with every activation lever: activations are the problem",
          old=PLAN, new='    return {"stage": 0, "recompute": "full", "micro_batches": batch}\n',
          hint=["the peak memory", "DDP holds the whole model state on every rank"]),
    wrong("3.4", "misconception", "fits by computing in float32",
          old=PLAN, new='    return {"stage": 1, "micro_batches": batch, "dtype": "float32"}\n',
          hint=["dtype='float32' (the model's: 'float64')", "not its numbers"]),
    wrong("3.4", "small-only", "full recomputation alone: right for small batches",
          old=PLAN, new='    return {"stage": 1, "recompute": "full"}\n',
          hint=["batch=8", "activations are the largest"]),
    wrong("3.4", "small-only", "two micro-batches: right up to 2 sequences a rank",
          old=PLAN, new='    return {"stage": 1, "micro_batches": min(batch, 2)}\n',
          hint=["batch=4", "the peak memory"]),
]

RIGHT = [
    right("ZeRO-1 with micro-batches of one sequence, no recomputation (no extra FLOPs)",
          old=PLAN, new='    return {"stage": 1, "micro_batches": batch}\n'),
    right("ZeRO-2, full recomputation, micro-batches of one sequence",
          old=PLAN, new='    return {"stage": 2, "recompute": "full", "micro_batches": batch}\n'),
    right("a ZeRO-1 step whose moments are written with np.multiply and np.square",
          old=MOMENTS, new=("    m = np.multiply(m, b1) + (1.0 - b1) * g\n"
                            "    v = np.multiply(v, b2) + (1.0 - b2) * np.square(g)\n")),
]

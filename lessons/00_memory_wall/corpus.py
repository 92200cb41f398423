"""Lesson 00's known answers: what learners write, wrong and right, as patches of solution.py.

`minipar lessons corpus 00` grades each one; tests/course/test_corpus.py runs them in CI.
"""

from minipar.course.corpus import right, wrong

BODY_0_3 = """    if sharded == 0:
        return 1 if replicated <= gpu_bytes else None
    if replicated >= gpu_bytes:
        return None
    n = max(1, math.ceil(sharded / (gpu_bytes - replicated)))
    # the division above is exact in real numbers; step once each way for float rounding
    if n > 1 and replicated + sharded / (n - 1) <= gpu_bytes:
        n -= 1
    elif replicated + sharded / n > gpu_bytes:
        n += 1
    return n
"""
PLAN_START = "    per_gpu = GLOBAL_BATCH // GPUS  # sequences each GPU trains on per step\n"


def plan(zero, recompute, micro_batch, accumulation, why):
    """A patch of plan_step that returns one plan for every sequence length."""
    return (PLAN_START, f"    return {{'zero': {zero}, 'recompute': {recompute!r}, "
                        f"'micro_batch': {micro_batch}, 'accumulation': {accumulation}}}"
                        f"  # {why}\n" + PLAN_START)


WRONG = [
    # -- 0.1: model-state bytes per GPU
    wrong("0.1", "misconception", "ZeRO-1 keeps the fp32 master whole, shards only m and v",
          old="    optimizer = 12 * psi / (n if stage >= 1 else 1)\n",
          new="    optimizer = 4 * psi + 8 * psi / (n if stage >= 1 else 1)  # m, v sharded\n",
          hint=["keeps 8 bytes a parameter whole", "ZeRO stage 1 keeps 4 whole",
                "the fp32 master weights and both Adam moments"]),
    wrong("0.1", "misconception", "DDP splits the model over its n GPUs",
          old="    return float(weights + grads + optimizer)\n",
          new="    if stage == 0:  # data parallel: each GPU holds its share\n"
              "        return float(16 * psi / n)\n"
              "    return float(weights + grads + optimizer)\n",
          hint=["keeps 0 bytes a parameter whole", "DDP (stage 0) replicates",
                "smallest failing configuration: psi=1024, stage=0"]),
    wrong("0.1", "small-only", "shards inside one node of 8 GPUs only (HYBRID_SHARD's layout)",
          old="    weights = 2 * psi / (n if stage >= 3 else 1)\n",
          new="    n = min(n, 8)  # ZeRO shards over the GPUs of a node\n"
              "    weights = 2 * psi / (n if stage >= 3 else 1)\n",
          hint=["right at n = 1 and n = 2 but not at n = 16", "n=16"]),
    # -- 0.2: activation bytes
    wrong("0.2", "misconception", "full recomputation keeps nothing",
          old='"full": 2 * sbh}[recompute]', new='"full": 0}[recompute]',
          hint=["full recomputation still keeps each layer's input", "recompute='full'"]),
    wrong("0.2", "misconception", "selective and full swapped",
          old='per_layer = {"none": sbh * (34 + 5 * a * s / h), "selective": 34 * sbh,\n'
              '                 "full": 2 * sbh}[recompute]',
          new='per_layer = {"none": sbh * (34 + 5 * a * s / h), "selective": 2 * sbh,\n'
              '                 "full": 34 * sbh}[recompute]',
          hint=["your count for recompute='selective' is the count of 'full'"]),
    wrong("0.2", "small-only", "one layer's count (right for one layer)",
          old="    return float(layers * per_layer)\n",
          new="    return float(per_layer)  # the count of section 2\n",
          hint=["received = 1/n (n = 2) expected everywhere: one layer's count", "layers=2"]),
    wrong("0.2", "small-only", "integer division in the attention term",
          old="5 * a * s / h", new="5 * a * s // h",
          hint=["did an integer division (//) drop a fraction?", "head_dim=2"]),
    # -- 0.3: the fewest GPUs
    wrong("0.3", "misconception", "total bytes over one GPU's memory, at every stage",
          old="    if sharded == 0:\n",
          new="    return max(1, math.ceil(16 * psi / gpu_bytes))  # spread over the GPUs\n"
              "    if sharded == 0:\n",
          hint=["no number of GPUs is enough", "what no n divides does not fit", "stage=0"]),
    wrong("0.3", "misconception", "ceil(x) written as floor(x) + 1",
          old=BODY_0_3,
          new="    if sharded == 0:\n"
              "        return 1 if replicated <= gpu_bytes else None\n"
              "    if replicated >= gpu_bytes:\n"
              "        return None\n"
              "    return int(sharded // (gpu_bytes - replicated)) + 1  # ceil\n",
          hint=["fewer GPUs already fit", "exactly the budget"]),
    wrong("0.3", "small-only", "a search over 1 to 1024 GPUs",
          old=BODY_0_3,
          new="    for n in range(1, 1025):  # up to 128 nodes of 8 GPUs\n"
              "        if replicated + sharded / n <= gpu_bytes:\n"
              "            return n\n"
              "    return None\n",
          hint=["an answer exists", "more than a thousand GPUs"]),
    # -- 0.4: a step within the budget
    wrong("0.4", "misconception", "DDP with recomputation and micro-batches of one",
          edits=[plan(0, "selective", 1, 4, "activations are what overflows")],
          hint=["plan_step(32)", "peak memory during the step",
                "over its budget of 3 MB", "the largest is optimizer_states"]),
    wrong("0.4", "misconception", "full recomputation, the safe choice",
          edits=[plan(1, "full", 4, 1, "recompute everything, keep the batch whole")],
          hint=["plan_step(32)", "FLOPs over those of the step without recomputation",
                "over its budget of 1.1", "reruns every layer's whole forward"]),
    wrong("0.4", "misconception", "a smaller micro-batch without more accumulation",
          edits=[plan(1, "selective", 1, 1, "one sequence per GPU fits")],
          hint=["4 × 1 × 1 = 4 sequences", "the global batch is 16"]),
    wrong("0.4", "small-only", "ZeRO-3 and no recomputation (fits short sequences)",
          edits=[plan(3, "none", 4, 1, "ZeRO-3 shards everything")],
          hint=["plan_step(64)", "over its budget of 3 MB",
                "the largest is activations"]),
]

RIGHT = [
    right("one plan for every length (ZeRO-1, selective, one sequence at a time); 0.1 as a "
          "table of whole and sharded bytes",
          edits=[plan(1, "selective", 1, 4, "the scores dropped, one sequence at a time"),
                 ("    weights = 2 * psi / (n if stage >= 3 else 1)\n"
                  "    grads = 2 * psi / (n if stage >= 2 else 1)\n"
                  "    optimizer = 12 * psi / (n if stage >= 1 else 1)\n"
                  "    return float(weights + grads + optimizer)\n",
                  "    whole = {0: 16, 1: 4, 2: 2, 3: 0}[stage]  # bytes a parameter kept whole\n"
                  "    return float(whole * psi + (16 - whole) * psi / n)\n")]),
    right("plans searched with exercises 0.1 and 0.2 and a safety margin; 0.3 by bisection",
          edits=[(PLAN_START,
                  "    from minipar.nn import GPTConfig\n"
                  "    psi = GPTConfig(seq_len=seq_len, **MODEL).num_parameters()\n"
                  "    for zero in (1, 2, 3):\n"
                  "        for recompute in ('none', 'selective'):\n"
                  "            for mb in (4, 2, 1):\n"
                  "                guess = model_state_bytes_per_gpu(psi, zero, GPUS) + \\\n"
                  "                    activation_bytes(seq_len, mb, MODEL['hidden'],\n"
                  "                                     MODEL['num_heads'], MODEL['num_layers'],\n"
                  "                                     recompute)\n"
                  "                if guess <= 0.6 * BUDGET_BYTES:  # room for the rest\n"
                  "                    return {'zero': zero, 'recompute': recompute,\n"
                  "                            'micro_batch': mb, 'accumulation': 4 // mb}\n"
                  + PLAN_START),
                 (BODY_0_3,
                  "    def fits(n):\n"
                  "        return replicated + sharded / n <= gpu_bytes\n"
                  "    if not fits(2**62):\n"
                  "        return None\n"
                  "    lo, hi = 0, 2**62  # fits(hi); lo = 0 or not fits(lo)\n"
                  "    while hi - lo > 1:\n"
                  "        mid = (lo + hi) // 2\n"
                  "        lo, hi = (lo, mid) if fits(mid) else (mid, hi)\n"
                  "    return hi\n")]),
]

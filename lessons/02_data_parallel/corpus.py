"""Lesson 02's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass every exercise."""

from minipar.course.corpus import right, wrong

# ---- the solution's lines the cases replace -----------------------------------------
AVG = '        p.grad[...] = mp.all_reduce(p.grad, "avg", group=group)  # p.grad: p\'s full shape\n'
WALK = "    for i in reversed(range(len(sizes_bytes))):\n"
CLOSE = """        current.append(i)
        nbytes += sizes_bytes[i]
        if nbytes >= cap_bytes:  # at least the cap: close it
            buckets.append(current)
            current, nbytes = [], 0
"""
LAST = "        last = max([last] + [position[u] for u in units])  # buckets go out in order\n"
SHARE = "        share = x.shape[1] / n  # 1/k when the micro-batches are equal\n"
QUIET = "        quiet = engine is not None and i < k - 1\n"
BACKWARD = "            loss += share * model.loss_and_grad(x, y, loss_scale=share)\n"
CAP = "                                     bucket_cap_mb=cap / 2**20)\n"
EDGES = "    edges = [*range(0, b - last, max_sequences), b - last, b]  # its backward hides buckets\n"
STEP = "    accumulate(model, micro, engine)\n"
STEP_25 = CAP + """    b = ids.shape[1]
    last = min(b, max_sequences)  # the last micro-batch as large as memory allows:
""" + EDGES + """    micro = [(ids[:, a:e], targets[:, a:e]) for a, e in zip(edges, edges[1:])]  # [s, n_i]
""" + STEP

WRONG = [
    # 2.1 -------------------------------------------------------------------------------
    wrong("2.1", "misconception", "sums the gradients instead of averaging them",
          old=AVG, new='        p.grad[...] = mp.all_reduce(p.grad, "sum", group=group)\n',
          hint=["received = 2× expected everywhere: summed over the group where the mean "
                "was wanted", "smallest failing configuration: size=2"]),
    wrong("2.1", "misconception", "all-reduces over the world, ignoring the group",
          old=AVG, new='        p.grad[...] = mp.all_reduce(p.grad, "avg")\n',
          hint=["not over its group", "Pass the group to every collective"]),
    wrong("2.1", "misconception", "expects all_reduce to work in place, as torch.distributed's",
          old=AVG, new='        mp.all_reduce(p.grad, "avg", group=group)\n',
          hint=["still holds this rank's own gradient", "return a new array"]),
    wrong("2.1", "small-only", "hard-coded for 2 ranks: the sum divided by 2",
          old=AVG, new='        p.grad[...] = mp.all_reduce(p.grad, "sum", group=group) / 2\n',
          hint=["received = 1.5× expected everywhere", "divided by 2, not by the group's size",
                "size=3"]),
    wrong("2.1", "small-only", "divides the sum by the world's size, right on a 1-D world",
          old=AVG, new=('        p.grad[...] = mp.all_reduce(p.grad, "sum", group=group) / '
                        'mp.get_world_size()\n'),
          hint=["received = ½ expected everywhere", "divided by the world's size"]),
    # 2.2 -------------------------------------------------------------------------------
    wrong("2.2", "misconception", "walks the parameters from the first to the last",
          old=WALK, new="    for i in range(len(sizes_bytes)):\n",
          hint=["the first bucket starts with index 0", "backward finishes first"]),
    wrong("2.2", "misconception", "never lets a bucket pass the cap: the crossing parameter "
          "opens the next one",
          old=CLOSE, new="""        if current and nbytes + sizes_bytes[i] > cap_bytes:  # it would overflow
            buckets.append(current)
            current, nbytes = [], 0
        current.append(i)
        nbytes += sizes_bytes[i]
""", hint=["the parameter that crosses the cap belongs to it"]),
    wrong("2.2", "misconception", "closes a bucket only once it holds more than the cap",
          old="        if nbytes >= cap_bytes:  # at least the cap: close it\n",
          new="        if nbytes > cap_bytes:  # over the cap: close it\n",
          hint=["as soon as it holds at least cap_bytes"]),
    wrong("2.2", "small-only", "one list reused for every bucket, right while the model fits "
          "one bucket",
          old="            buckets.append(current)\n            current, nbytes = [], 0\n",
          new="            buckets.append(current)\n            current.clear()\n"
              "            nbytes = 0\n",
          hint=["exactly once"]),
    # 2.3 -------------------------------------------------------------------------------
    wrong("2.3", "misconception", "launches a bucket as soon as one of its units is done",
          old=LAST, new="        last = min(position[u] for u in units)  # one unit is done\n",
          hint=["whose backward finishes later"]),
    wrong("2.3", "misconception", "every bucket at the end of the backward",
          old="        launched.append(backward_order[last])\n",
          new="        launched.append(backward_order[-1])  # when the backward is over\n",
          hint=["it could go out at", "the first backward_post"]),
    wrong("2.3", "small-only", "forgets the buckets ahead, right on DDP's own buckets",
          old=LAST, new="        last = max(position[u] for u in units)  # its own units\n",
          hint=["never before the one ahead of it", "general=True"]),
    # 2.4 -------------------------------------------------------------------------------
    wrong("2.4", "misconception", "never leaves no_sync(), so nothing is all-reduced",
          old=QUIET, new="        quiet = engine is not None\n",
          hint=["no all-reduce ran", "the last backward must run outside it"]),
    wrong("2.4", "misconception", "adds the micro-batch losses",
          old=BACKWARD, new="            loss += share * model.loss_and_grad(x, y)\n",
          hint=["expected everywhere: the micro-batch losses were added, not averaged"]),
    wrong("2.4", "misconception", "the first micro-batch communicates and the rest stay quiet",
          old=QUIET, new="        quiet = engine is not None and i > 0\n",
          hint=["before the last of the", "only the last backward may communicate"]),
    wrong("2.4", "small-only", "weighs every micro-batch 1/k, right for equal sizes only",
          old=SHARE, new="        share = 1 / k\n",
          hint=["equal weights are right for equal sizes only"]),
    wrong("2.4", "small-only", "returns the plain mean of the micro-batch losses",
          old=BACKWARD, new="            loss += model.loss_and_grad(x, y, loss_scale=share) / k\n",
          hint=["the loss accumulate", "weighed by its part"]),
    # 2.5 -------------------------------------------------------------------------------
    wrong("2.5", "misconception", "equal micro-batches: the last backward is too short",
          old=EDGES, new=("    k = -(-b // max_sequences)  # as few micro-batches as fit\n"
                          "    edges = [round(i * b / k) for i in range(k + 1)]  # equal\n"),
          hint=["over its budget of 9.5 µs", "cannot hide"]),
    wrong("2.5", "misconception", "keeps DDP's default 25 MiB bucket",
          old=CAP, new="                                     bucket_cap_mb=25.0)\n",
          hint=["over its budget of 9.5 µs", "after the compute ended"]),
    wrong("2.5", "misconception", "no no_sync(): every micro-batch all-reduces",
          old=STEP, new=("    for x, y in micro:\n"
                         "        model.loss_and_grad(x, y, loss_scale=x.shape[1] / b)\n"),
          hint=["over its budget", "before the last of this rank's 2 forwards began"]),
    wrong("2.5", "misconception", "the whole batch in one forward",
          old=EDGES, new="    edges = [0, b]  # no accumulation\n",
          hint=["the peak of activations on the ledger", "over its budget of 35.2"]),
    wrong("2.5", "misconception", "no_sync() around the whole step, hoping it syncs at the end",
          old=STEP, new=("    with engine.no_sync():  # one sync at the end\n"
                         "        accumulate(model, micro)\n"),
          hint=["ran no gradient communication"]),
    wrong("2.5", "misconception", "DDP over the world instead of the group",
          old="    engine = DistributedDataParallel(model, AdamW, process_group=group,\n",
          new="    engine = DistributedDataParallel(model, AdamW,\n",
          hint=["not over its group", "process_group=group"]),
    wrong("2.5", "small-only", "cuts the batch front to back, right while it fits one forward",
          old=EDGES, new="    edges = [*range(0, b, max_sequences), b]  # 16, then the rest\n",
          hint=["over its budget of 9.5 µs"]),
    wrong("2.5", "small-only", "weighs the micro-batches 1/k, right while they are equal",
          old=STEP, new=("    k = len(micro)\n"
                         "    for i, (x, y) in enumerate(micro):\n"
                         "        with engine.no_sync() if i < k - 1 else "
                         "contextlib.nullcontext():\n"
                         "            model.loss_and_grad(x, y, loss_scale=1 / k)\n"),
          hint=["they weigh differently"]),
]

HOOKS_25 = """    units = dict(model.units())
    b = ids.shape[1]
    last = min(b, max_sequences)
    edges = [*range(0, b - last, max_sequences), b - last, b]  # the largest last
    pending = []  # (unit, work): one all-reduce per unit, launched as its backward ends

    def launch(unit):
        flat = np.concatenate([p.grad.ravel() for p in units[unit]])  # [numel]
        pending.append((unit, mp.all_reduce(flat, "avg", group=group, async_op=True)))

    for a, e in zip(edges, edges[1:]):
        if e == b:  # the last backward: each unit's all-reduce goes out as the unit ends
            remove = model.hooks.register("backward_post", launch)
        model.loss_and_grad(ids[:, a:e], targets[:, a:e], loss_scale=(e - a) / b)
    remove()
    for unit, work in pending:
        flat = work.wait()
        for p in units[unit]:
            p.grad[...] = flat[:p.size].reshape(p.shape)
            flat = flat[p.size:]
"""

RIGHT = [
    right("2.1 as one all-reduce of every gradient laid end to end; 2.5 without an engine, "
          "an all-reduce per unit launched from backward_post hooks",
          edits=[("    for p in model.parameters():\n" + AVG,
                  """    params = model.parameters()
    flat = np.concatenate([p.grad.ravel() for p in params])  # [Ψ]
    flat = mp.all_reduce(flat, "avg", group=group)
    for p in params:
        p.grad[...] = flat[:p.size].reshape(p.shape)
        flat = flat[p.size:]
"""),
                 ("""    blocks = [ps for unit, ps in model.units() if unit != "root"]
    cap = max(sum(p.data.nbytes for p in ps) for ps in blocks)  # one bucket per block
    engine = DistributedDataParallel(model, AdamW, process_group=group,
""" + STEP_25, HOOKS_25)]),
    right("2.5 with buckets of 0.9 of a block and micro-batches of 4 before the last",
          edits=[("    cap = max(sum(p.data.nbytes for p in ps) for ps in blocks)  # one bucket "
                  "per block\n",
                  "    cap = 0.9 * max(sum(p.data.nbytes for p in ps) for ps in blocks)\n"),
                 (EDGES, "    edges = [*range(0, b - last, 4), b - last, b]  # 4, 4, ..., last\n")]),
]

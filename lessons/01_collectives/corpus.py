"""Lesson 01's corpus: answers a learner writes, as patches of solution.py. Each wrong one
must fail with the hint meant for it; each right one must pass (`minipar lessons corpus 01`).
"""

from minipar.course.corpus import right, wrong

# -- the text of solution.py the cases patch ---------------------------------------------
RS_NEIGHBOURS = ("    me, n, right, left = ring_neighbours(group)\n"
                 "    chunks = [c.copy() for c in np.array_split(")
RS_CHUNKS = ("    chunks = [c.copy() for c in np.array_split(np.asarray(x).reshape(-1), n)]"
             "  # n x [~size/n]\n")
RS_SCHEDULE = "        send_c, recv_c = (me - s - 1) % n, (me - s - 2) % n\n"
RS_STEP = ("        work = mp.isend(chunks[send_c], right, group=group)\n"
           "        got = mp.recv(left, group=group)  # the partial sum of chunk recv_c so far\n"
           "        work.wait()\n")
AG_NEIGHBOURS = ("    me, n, right, left = ring_neighbours(group)\n"
                 "    chunks: list[Optional[np.ndarray]]")
AG_STEP = ("        work = mp.isend(chunks[send_c], right, group=group)\n"
           "        chunks[recv_c] = mp.recv(left, group=group)\n"
           "        work.wait()\n")
AG_BODY = AG_NEIGHBOURS + (" = [None] * n  # chunks[c]: group rank c's chunk\n"
                           "    chunks[me] = np.array(chunk, copy=True)\n"
                           "    for s in range(n - 1):\n"
                           "        send_c, recv_c = (me - s) % n, (me - s - 1) % n\n") + AG_STEP + (
                           "    return np.concatenate(chunks, axis=0)\n")
AR_BODY = ("    mine = ring_reduce_scatter(x, group)  # [~x.size / n]: my chunk of the sum\n"
           "    return ring_all_gather(mine, group).reshape(x.shape)  # every chunk, in group order\n")
FACTOR = ('    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,\n'
          '              "reduce_scatter": (n - 1) / n}[kind]\n')
X5_GROUPS = ("    in_node = mp.new_group(range(node * m, (node + 1) * m), name=\"node\")  # NVLink\n"
             "    across = mp.new_group(range(local, topology.world_size, m), name=\"across\")"
             "  # one per node\n")
X5_STEPS = ("    shard = mp.reduce_scatter(padded, group=in_node)  # [len/m]: my shard, summed in my node\n"
            "    shard = mp.all_reduce(shard, group=across)  # [len/m]: summed over the nodes, 1/m over IB\n"
            "    out = mp.all_gather(shard, group=in_node)  # [m * ceil(len/m)]: every shard, in my node\n")
X5_PAD = ("    padded = np.concatenate([flat, np.zeros((-flat.size) % m, flat.dtype)])"
          "  # [m * ceil(len/m)]\n")
X5_RETURN = "    return out[: flat.size].reshape(np.shape(grad))\n"
X5_TAIL = X5_PAD + X5_STEPS + X5_RETURN
DEADLOCK = ["raised DeadlockError", "send blocks until the receiver posts its recv",
            "Post both sides at once (isend, then recv, then wait on the send",
            "alternate by parity"]
OVER = "over its budget of 55 us by"

WRONG = [
    # -- 1.1 ring reduce-scatter -----------------------------------------------------------
    wrong("1.1", "misconception", "a blocking send before the recv around the ring",
          old=RS_STEP, new="        mp.send(chunks[send_c], right, group=group)\n"
                           "        got = mp.recv(left, group=group)\n",
          hint=DEADLOCK + ["smallest failing configuration: n=2"], also={"1.3"}),
    wrong("1.1", "misconception", "ignores the group: the world's rank and size",
          old=RS_NEIGHBOURS, new="    me, n = mp.get_rank(), mp.get_world_size()\n"
                                 "    right, left = (me + 1) % n, (me - 1) % n\n"
                                 "    chunks = [c.copy() for c in np.array_split(",
          hint=["raised CollectiveUsageError", "needs another member of group"], also={"1.3"}),
    wrong("1.1", "misconception", "the library's schedule: rank r ends with chunk r + 1",
          old=RS_SCHEDULE, new="        send_c, recv_c = (me - s) % n, (me - s - 1) % n\n",
          hint=["group rank r returns chunk r of the flattened sum",
                "chunk c must start at group rank c + 1"]),
    wrong("1.1", "small-only", "equal chunks of x.size // n: drops the remainder",
          old=RS_CHUNKS, new="    c = x.size // n  # elements per chunk\n"
                             "    chunks = [np.asarray(x).reshape(-1)[i * c:(i + 1) * c].copy()"
                             " for i in range(n)]\n",
          hint=["has shape (1,), expected shape (2,)", "np.array_split(x.reshape(-1), n)"]),
    wrong("1.1", "small-only", "a schedule worked out on 2 ranks: always send the next chunk",
          old=RS_SCHEDULE, new="        send_c, recv_c = (me + 1) % n, me\n",
          hint=["group rank r returns chunk r", "smallest failing configuration: n=3"]),
    # -- 1.2 ring all-gather ---------------------------------------------------------------
    wrong("1.2", "misconception", "a blocking send before the recv around the ring",
          old=AG_STEP, new="        mp.send(chunks[send_c], right, group=group)\n"
                           "        chunks[recv_c] = mp.recv(left, group=group)\n",
          hint=DEADLOCK + ["(at answer_"], also={"1.3"}),
    wrong("1.2", "misconception", "send/recv given group ranks instead of global ranks",
          old=AG_NEIGHBOURS, new="    me, n = mp.get_rank(group), mp.get_world_size(group)\n"
                                 "    right, left = (me + 1) % n, (me - 1) % n\n"
                                 "    chunks: list[Optional[np.ndarray]]",
          hint=["raised CollectiveUsageError", "is a global rank"], also={"1.3"}),
    wrong("1.2", "misconception", "concatenates the chunks in the order they arrived",
          old=AG_BODY, new="    me, n, right, left = ring_neighbours(group)\n"
                           "    arrived = [np.array(chunk, copy=True)]  # mine, then as they come\n"
                           "    for s in range(n - 1):\n"
                           "        work = mp.isend(arrived[-1], right, group=group)\n"
                           "        arrived.append(mp.recv(left, group=group))\n"
                           "        work.wait()\n"
                           "    return np.concatenate(arrived, axis=0)\n",
          hint=["concatenated in group-rank order", "smallest failing configuration: n=2"]),
    wrong("1.2", "small-only", "n equal slots of len(chunk), as all_gather_into_tensor",
          old="    return np.concatenate(chunks, axis=0)\n",
          new="    out = np.empty(n * len(chunk))  # n slots of my chunk's length\n"
              "    for c in range(n):\n"
              "        out[c * len(chunk):(c + 1) * len(chunk)] = chunks[c]\n"
              "    return out\n",
          hint=["has shape (4,), expected shape (3,)", "let chunks differ in length",
                "extra=1"]),
    wrong("1.2", "small-only", "written for 2 ranks: swap chunks with the neighbour",
          old=AG_BODY, new="    me, n, right, left = ring_neighbours(group)\n"
                           "    if n == 1:\n"
                           "        return np.array(chunk, copy=True)\n"
                           "    work = mp.isend(chunk, right, group=group)\n"
                           "    theirs = mp.recv(left, group=group)\n"
                           "    work.wait()\n"
                           "    return np.concatenate([chunk, theirs] if me == 0 else [theirs, chunk])\n",
          hint=["expected shape", "smallest failing configuration: n=3"]),
    # -- 1.3 ring all-reduce ---------------------------------------------------------------
    wrong("1.3", "misconception", "calls mp.all_reduce instead of building it from 1.1 and 1.2",
          old=AR_BODY, new="    return mp.all_reduce(x, group=group)\n",
          hint=["called the built-in all_reduce",
                "must be built from your ring_reduce_scatter (1.1) and ring_all_gather (1.2)"]),
    wrong("1.3", "misconception", "in place, as torch.distributed.all_reduce is",
          old=AR_BODY, new="    mine = ring_reduce_scatter(x, group)\n"
                           "    x[...] = ring_all_gather(mine, group).reshape(x.shape)  # in place\n"
                           "    return x\n",
          hint=["wrote into its input `x`", "compute into a new array"]),
    wrong("1.3", "small-only", "every rank sends all of x to every other rank",
          old=AR_BODY, new="    me, ranks = mp.get_rank(group), list(group.ranks) if group else "
                           "list(range(mp.get_world_size()))\n"
                           "    works = [mp.isend(x, r, group=group) for i, r in enumerate(ranks)"
                           " if i != me]\n"
                           "    total = x.copy()\n"
                           "    for i, r in enumerate(ranks):\n"
                           "        if i != me:\n"
                           "            total = total + mp.recv(r, group=group)\n"
                           "    for work in works:\n"
                           "        work.wait()\n"
                           "    return total\n",
          hint=["received = 1.5× expected", "which is the same only at n = 2",
                "smallest failing configuration: n=3"]),
    wrong("1.3", "small-only", "forgets to give the sum x's shape: right for 1-D x only",
          old=AR_BODY, new="    mine = ring_reduce_scatter(x, group)\n"
                           "    return ring_all_gather(mine, group)\n",
          hint=["has shape (9,), expected shape (3, 3)", "with x's shape"]),
    # -- 1.4 bus bandwidth -----------------------------------------------------------------
    wrong("1.4", "misconception", "the all-reduce factor for every collective",
          old=FACTOR, new="    factor = 2 * (n - 1) / n\n",
          hint=["received = 2× expected everywhere: the all-reduce factor where all-gather"]),
    wrong("1.4", "misconception", "divides algbw by the factor",
          old="    return algbw * factor\n", new="    return algbw / factor if factor else 0.0\n",
          hint=["you divided algbw by the factor"]),
    wrong("1.4", "small-only", "integer division: 2 * (n - 1) // n",
          old=FACTOR, new='    factor = {"all_reduce": 2 * (n - 1) // n, "all_gather": (n - 1) / n,\n'
                          '              "reduce_scatter": (n - 1) / n}[kind]\n',
          hint=["`//` is integer division", "n=3"]),
    # -- 1.5 an all-reduce across nodes within the budget ---------------------------------
    wrong("1.5", "misconception", "over budget: one mp.all_reduce over the world",
          old=X5_TAIL, new="    return mp.all_reduce(grad)\n",
          hint=[OVER, "1 x all_reduce over [0, 1, 2, 3, 4, 5, 6, 7] on IB-NDR400"]),
    wrong("1.5", "misconception", "over budget: ranks placed round-robin (node = r % nodes)",
          old=X5_GROUPS, new="    k, r = topology.num_nodes, mp.get_rank()\n"
                             "    in_node = mp.new_group(range(r % k, topology.world_size, k))\n"
                             "    across = mp.new_group(range(r // k * k, r // k * k + k))\n",
          hint=[OVER, "reduce_scatter over [0, 2, 4, 6] on IB-NDR400"]),
    wrong("1.5", "misconception", "over budget: across the nodes first, then inside",
          old=X5_PAD + X5_STEPS,
          new="    k = topology.num_nodes\n"
              "    padded = np.concatenate([flat, np.zeros((-flat.size) % k, flat.dtype)])\n"
              "    shard = mp.reduce_scatter(padded, group=across)  # 1/k of the bucket each\n"
              "    shard = mp.all_reduce(shard, group=in_node)\n"
              "    out = mp.all_gather(shard, group=across)\n",
          hint=[OVER, "reduce_scatter over [0, 4] on IB-NDR400"]),
    wrong("1.5", "misconception", "over budget: four chunks in flight pay four times the latency",
          old=X5_PAD + X5_STEPS,
          new="    padded = np.concatenate([flat, np.zeros((-flat.size) % (4 * m), flat.dtype)])\n"
              "    pieces = np.array_split(padded, 4)  # 4 chunks, each a multiple of m\n"
              "    rs = [mp.reduce_scatter(p, group=in_node, async_op=True) for p in pieces]\n"
              "    ar = [mp.all_reduce(w.wait(), group=across, async_op=True) for w in rs]\n"
              "    ag = [mp.all_gather(w.wait(), group=in_node, async_op=True) for w in ar]\n"
              "    out = np.concatenate([w.wait() for w in ag])\n",
          hint=[OVER, "4 x all_reduce over [0, 4] on IB-NDR400"]),
    wrong("1.5", "misconception", "all-reduces the node's sum again over the whole world",
          old=X5_TAIL, new="    in_sum = mp.all_reduce(grad, group=in_node)  # my node's sum\n"
                           "    return mp.all_reduce(in_sum)  # ... over every rank\n",
          hint=["received = n× (n = 2) expected everywhere: every GPU of a node added in"]),
    wrong("1.5", "misconception", "writes the sum into grad, as torch's in-place all_reduce",
          old=X5_RETURN, new="    grad[...] = out[: flat.size].reshape(np.shape(grad))  # in place\n"
                             "    return grad\n",
          hint=["wrote into its input `grad`"]),
    wrong("1.5", "small-only", "two nodes hard-coded: one GPU here and its twin on the other",
          old=X5_GROUPS, new="    in_node = mp.new_group(range(node * m, (node + 1) * m))\n"
                             "    across = mp.new_group([local, local + m])  # node 0 and node 1\n",
          hint=["on 3 node(s) of 2 GPU(s)", "smallest failing configuration: nodes=3"]),
    wrong("1.5", "small-only", "no padding: the 4 MiB bucket divides by 4, other lengths not",
          old=X5_PAD, new="    padded = flat\n",
          hint=["not divisible by 2; pad axis 0", "gpus=2, length=3"]),
    wrong("1.5", "small-only", "pads the bucket, returns the padded sum",
          old=X5_RETURN, new="    return out\n",
          hint=["has shape (4,), expected shape (3,)"]),
]

RIGHT = [
    right("rings that alternate send and recv by parity (no isend)", edits=[
        (RS_STEP, "        if me % 2 == 0:\n"
                  "            mp.send(chunks[send_c], right, group=group)\n"
                  "            got = mp.recv(left, group=group)\n"
                  "        else:\n"
                  "            got = mp.recv(left, group=group)\n"
                  "            mp.send(chunks[send_c], right, group=group)\n"),
        (AG_STEP, "        if me % 2 == 0:\n"
                  "            mp.send(chunks[send_c], right, group=group)\n"
                  "            chunks[recv_c] = mp.recv(left, group=group)\n"
                  "        else:\n"
                  "            chunks[recv_c] = mp.recv(left, group=group)\n"
                  "            mp.send(chunks[send_c], right, group=group)\n")]),
    right("a reduce-scatter whose isend is never waited on (its recv was posted)",
          old="        work.wait()\n        chunks[recv_c] = got + chunks[recv_c]\n",
          new="        chunks[recv_c] = got + chunks[recv_c]\n"),
    right("1.5 from the rings of 1.1-1.3 on the node and across groups (no padding)",
          old=X5_TAIL, new="    shard = ring_reduce_scatter(grad, in_node)  # uneven chunks are fine\n"
                           "    shard = ring_all_reduce(shard, across)\n"
                           "    return ring_all_gather(shard, in_node).reshape(np.shape(grad))\n"),
    right("1.5 in two chunks in flight: the node's and the network's work overlap",
          old=X5_TAIL, new="    padded = np.concatenate([flat, np.zeros((-flat.size) % (2 * m), flat.dtype)])\n"
                           "    rs = [mp.reduce_scatter(p, group=in_node, async_op=True)\n"
                           "          for p in np.array_split(padded, 2)]\n"
                           "    ar = [mp.all_reduce(w.wait(), group=across, async_op=True) for w in rs]\n"
                           "    ag = [mp.all_gather(w.wait(), group=in_node, async_op=True) for w in ar]\n"
                           "    return np.concatenate([w.wait() for w in ag])[: flat.size]\n"),
]

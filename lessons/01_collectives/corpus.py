"""Lesson 01's corpus: answers a learner writes, as patches of solution.py. Each wrong one
must fail with the hint meant for it; each right one must pass (`minipar lessons corpus 01`).
"""

import textwrap
from pathlib import Path

from minipar.course.corpus import right, wrong

SOLUTION = (Path(__file__).parent / "solution.py").read_text(encoding="utf-8")


def line(start: str) -> str:
    """The one line of solution.py that begins with `start` (after its indentation)."""
    found = [ln for ln in SOLUTION.splitlines(keepends=True) if ln.lstrip().startswith(start)]
    assert len(found) == 1, f"{len(found)} lines of solution.py begin with {start!r}"
    return found[0]


def code(text: str, indent: int = 4) -> str:
    """A learner's lines, written flush left here, at a function body's indentation."""
    return textwrap.indent(textwrap.dedent(text).lstrip("\n"), " " * indent)


# -- the text of solution.py the cases patch ---------------------------------------------
RS_SCHEDULE = line("send_c, recv_c = (me - s - 1) % n")
NEIGHBOURS = "    me, n, right, left = ring_neighbours(group)\n"  # in 1.1 and in 1.2
ISEND = "        work = mp.isend(chunks[send_c], right, group=group)\n"  # in 1.1 and in 1.2
RS_STEP = ISEND + line("got = mp.recv(left") + "        work.wait()\n"
RS_START = NEIGHBOURS + line("chunks = [c.copy()")
AG_START = NEIGHBOURS + line("chunks: list[Optional")
AG_STEP = ISEND + line("chunks[recv_c] = mp.recv(left") + "        work.wait()\n"
AG_LOOP = "    for s in range(n - 1):\n" + line("send_c, recv_c = (me - s) % n") + AG_STEP
AG_RETURN = line("return np.concatenate(chunks, axis=0)")
AR_BODY = line("mine = ring_reduce_scatter(x, group)") + line("return ring_all_gather(mine")
FACTOR = line('factor = {"all_reduce"') + line('"reduce_scatter": (n - 1) / n}[kind]')
X5_GROUPS = line("in_node = mp.new_group(") + line("across = mp.new_group(")
X5_PAD = line("padded = np.concatenate(")
X5_STEPS = (line("shard = mp.reduce_scatter(padded") + line("shard = mp.all_reduce(shard")
            + line("out = mp.all_gather(shard"))
X5_RETURN = line("return out[: flat.size]")
X5_TAIL = X5_PAD + X5_STEPS + X5_RETURN

DEADLOCK = ["raised DeadlockError", "send blocks until the receiver posts its recv",
            "Post both sides at once (isend, then recv, then wait on the send",
            "alternate by parity"]
OVER = "over its budget of 55 us by"

WRONG = [
    # -- 1.1 ring reduce-scatter -----------------------------------------------------------
    wrong("1.1", "misconception", "a blocking send before the recv around the ring",
          old=RS_STEP, new=code("""
              mp.send(chunks[send_c], right, group=group)
              got = mp.recv(left, group=group)
              """, 8),
          hint=DEADLOCK + ["smallest failing configuration: n=2"], also={"1.3"}),
    wrong("1.1", "misconception", "ignores the group: the world's rank and size",
          old=RS_START, new=code("""
              me, n = mp.get_rank(), mp.get_world_size()
              right, left = (me + 1) % n, (me - 1) % n
              chunks = [c.copy() for c in np.array_split(np.asarray(x).reshape(-1), n)]
              """),
          hint=["raised CollectiveUsageError", "needs another member of group"], also={"1.3"}),
    wrong("1.1", "misconception", "the library's schedule: rank r ends with chunk r + 1",
          old=RS_SCHEDULE, new=code("send_c, recv_c = (me - s) % n, (me - s - 1) % n\n", 8),
          hint=["group rank r returns chunk r of the flattened sum",
                "chunk c must start at group rank c + 1"]),
    wrong("1.1", "small-only", "equal chunks of x.size // n: drops the remainder",
          old=line("chunks = [c.copy()"), new=code("""
              c = x.size // n  # elements per chunk
              chunks = [np.asarray(x).reshape(-1)[i * c:(i + 1) * c].copy() for i in range(n)]
              """),
          hint=["has shape (1,), expected shape (2,)", "np.array_split(x.reshape(-1), n)"]),
    wrong("1.1", "small-only", "a schedule worked out on 2 ranks: always send the next chunk",
          old=RS_SCHEDULE, new=code("send_c, recv_c = (me + 1) % n, me\n", 8),
          hint=["group rank r returns chunk r", "smallest failing configuration: n=3"]),
    # -- 1.2 ring all-gather ---------------------------------------------------------------
    wrong("1.2", "misconception", "a blocking send before the recv around the ring",
          old=AG_STEP, new=code("""
              mp.send(chunks[send_c], right, group=group)
              chunks[recv_c] = mp.recv(left, group=group)
              """, 8),
          hint=DEADLOCK + ["(at answer_"], also={"1.3"}),
    wrong("1.2", "misconception", "send/recv given group ranks instead of global ranks",
          old=AG_START, new=code("""
              me, n = mp.get_rank(group), mp.get_world_size(group)
              right, left = (me + 1) % n, (me - 1) % n
              chunks: list[Optional[np.ndarray]] = [None] * n
              """),
          hint=["raised CollectiveUsageError", "is a global rank"], also={"1.3"}),
    wrong("1.2", "misconception", "concatenates the chunks in the order they arrived",
          old=AG_LOOP + AG_RETURN, new=code("""
              arrived = [chunks[me]]  # mine, then each as it comes
              for s in range(n - 1):
                  work = mp.isend(arrived[-1], right, group=group)
                  arrived.append(mp.recv(left, group=group))
                  work.wait()
              return np.concatenate(arrived, axis=0)
              """),
          hint=["concatenated in group-rank order", "smallest failing configuration: n=2"]),
    wrong("1.2", "small-only", "n equal slots of len(chunk), as all_gather_into_tensor",
          old=AG_RETURN, new=code("""
              out = np.empty(n * len(chunk))  # n slots of my chunk's length
              for c in range(n):
                  out[c * len(chunk):(c + 1) * len(chunk)] = chunks[c]
              return out
              """),
          hint=["has shape (4,), expected shape (3,)", "let chunks differ in length",
                "extra=1"]),
    wrong("1.2", "small-only", "written for 2 ranks: swap chunks with the neighbour",
          old=AG_LOOP + AG_RETURN, new=code("""
              if n == 1:
                  return chunks[me]
              work = mp.isend(chunk, right, group=group)
              theirs = mp.recv(left, group=group)
              work.wait()
              return np.concatenate([chunks[me], theirs] if me == 0 else [theirs, chunks[me]])
              """),
          hint=["expected shape", "smallest failing configuration: n=3"]),
    # -- 1.3 ring all-reduce ---------------------------------------------------------------
    wrong("1.3", "misconception", "calls mp.all_reduce instead of building it from 1.1 and 1.2",
          old=AR_BODY, new=code("return mp.all_reduce(x, group=group)\n"),
          hint=["called the built-in all_reduce",
                "must be built from your ring_reduce_scatter (1.1) and ring_all_gather (1.2)"]),
    wrong("1.3", "misconception", "in place, as torch.distributed.all_reduce is",
          old=AR_BODY, new=code("""
              mine = ring_reduce_scatter(x, group)
              x[...] = ring_all_gather(mine, group).reshape(x.shape)  # in place
              return x
              """),
          hint=["wrote into its input `x`", "compute into a new array"]),
    wrong("1.3", "small-only", "every rank sends all of x to every other rank",
          old=AR_BODY, new=code("""
              me = mp.get_rank(group)
              ranks = list(group.ranks) if group else list(range(mp.get_world_size()))
              works = [mp.isend(x, r, group=group) for i, r in enumerate(ranks) if i != me]
              total = x.copy()
              for i, r in enumerate(ranks):
                  if i != me:
                      total = total + mp.recv(r, group=group)
              for work in works:
                  work.wait()
              return total
              """),
          hint=["received = 1.5× expected", "which is the same only at n = 2",
                "smallest failing configuration: n=3"]),
    wrong("1.3", "small-only", "forgets to give the sum x's shape: right for 1-D x only",
          old=AR_BODY, new=code("""
              mine = ring_reduce_scatter(x, group)
              return ring_all_gather(mine, group)
              """),
          hint=["has shape (9,), expected shape (3, 3)", "with x's shape"]),
    # -- 1.4 bus bandwidth -----------------------------------------------------------------
    wrong("1.4", "misconception", "the all-reduce factor for every collective",
          old=FACTOR, new=code("factor = 2 * (n - 1) / n\n"),
          hint=["received = 2× expected everywhere: the all-reduce factor where all-gather"]),
    wrong("1.4", "misconception", "divides algbw by the factor",
          old=line("return algbw * factor"),
          new=code("return algbw / factor if factor else 0.0\n"),
          hint=["you divided algbw by the factor"]),
    wrong("1.4", "small-only", "integer division: 2 * (n - 1) // n",
          old=FACTOR, new=FACTOR.replace("2 * (n - 1) / n", "2 * (n - 1) // n"),
          hint=["`//` is integer division", "n=3"]),
    # -- 1.5 an all-reduce across nodes within the budget ---------------------------------
    wrong("1.5", "misconception", "over budget: one mp.all_reduce over the world",
          old=X5_TAIL, new=code("return mp.all_reduce(grad)\n"),
          hint=[OVER, "1 x all_reduce over [0, 1, 2, 3, 4, 5, 6, 7] on IB-NDR400"]),
    wrong("1.5", "misconception", "over budget: ranks placed round-robin (node = r % nodes)",
          old=X5_GROUPS, new=code("""
              k, r = topology.num_nodes, mp.get_rank()
              in_node = mp.new_group(range(r % k, topology.world_size, k))
              across = mp.new_group(range(r // k * k, r // k * k + k))
              """),
          hint=[OVER, "reduce_scatter over [0, 2, 4, 6] on IB-NDR400"]),
    wrong("1.5", "misconception", "over budget: across the nodes first, then inside",
          old=X5_PAD + X5_STEPS, new=code("""
              k = topology.num_nodes
              padded = np.concatenate([flat, np.zeros((-flat.size) % k, flat.dtype)])
              shard = mp.reduce_scatter(padded, group=across)  # 1/k of the bucket each
              shard = mp.all_reduce(shard, group=in_node)
              out = mp.all_gather(shard, group=across)
              """),
          hint=[OVER, "reduce_scatter over [0, 4] on IB-NDR400"]),
    wrong("1.5", "misconception", "over budget: four chunks in flight pay four times the latency",
          old=X5_PAD + X5_STEPS, new=code("""
              padded = np.concatenate([flat, np.zeros((-flat.size) % (4 * m), flat.dtype)])
              pieces = np.array_split(padded, 4)  # 4 chunks, each a multiple of m
              rs = [mp.reduce_scatter(p, group=in_node, async_op=True) for p in pieces]
              ar = [mp.all_reduce(w.wait(), group=across, async_op=True) for w in rs]
              ag = [mp.all_gather(w.wait(), group=in_node, async_op=True) for w in ar]
              out = np.concatenate([w.wait() for w in ag])
              """),
          hint=[OVER, "4 x all_reduce over [0, 4] on IB-NDR400"]),
    wrong("1.5", "misconception", "all-reduces the node's sum again over the whole world",
          old=X5_TAIL, new=code("""
              in_sum = mp.all_reduce(grad, group=in_node)  # my node's sum
              return mp.all_reduce(in_sum)  # ... over every rank
              """),
          hint=["received = n× (n = 2) expected everywhere: every GPU of a node added in"]),
    wrong("1.5", "misconception", "writes the sum into grad, as torch's in-place all_reduce",
          old=X5_RETURN, new=code("""
              grad[...] = out[: flat.size].reshape(np.shape(grad))  # in place
              return grad
              """),
          hint=["wrote into its input `grad`"]),
    wrong("1.5", "small-only", "two nodes hard-coded: one GPU here and its twin on the other",
          old=X5_GROUPS, new=code("""
              in_node = mp.new_group(range(node * m, (node + 1) * m))
              across = mp.new_group([local, local + m])  # node 0 and node 1
              """),
          hint=["on 3 node(s) of 2 GPU(s)", "smallest failing configuration: nodes=3"]),
    wrong("1.5", "small-only", "no padding: the 4 MiB bucket divides by 4, other lengths not",
          old=X5_PAD, new=code("padded = flat\n"),
          hint=["not divisible by 2; pad axis 0", "gpus=2, length=3"]),
    wrong("1.5", "small-only", "pads the bucket, returns the padded sum",
          old=X5_RETURN, new=code("return out\n"),
          hint=["has shape (4,), expected shape (3,)"]),
]

RIGHT = [
    right("rings that alternate send and recv by parity (no isend)", edits=[
        (RS_STEP, code("""
             if me % 2 == 0:
                 mp.send(chunks[send_c], right, group=group)
                 got = mp.recv(left, group=group)
             else:
                 got = mp.recv(left, group=group)
                 mp.send(chunks[send_c], right, group=group)
             """, 8)),
        (AG_STEP, code("""
             if me % 2 == 0:
                 mp.send(chunks[send_c], right, group=group)
                 chunks[recv_c] = mp.recv(left, group=group)
             else:
                 chunks[recv_c] = mp.recv(left, group=group)
                 mp.send(chunks[send_c], right, group=group)
             """, 8))]),
    right("a reduce-scatter whose isend is never waited on (its recv was posted)",
          old="        work.wait()\n" + line("chunks[recv_c] = got + chunks[recv_c]"),
          new=line("chunks[recv_c] = got + chunks[recv_c]")),
    right("1.5 from the rings of 1.1-1.3 on the node and across groups (no padding)",
          old=X5_TAIL, new=code("""
              shard = ring_reduce_scatter(grad, in_node)  # uneven chunks are fine
              shard = ring_all_reduce(shard, across)
              return ring_all_gather(shard, in_node).reshape(np.shape(grad))
              """)),
    right("1.5 in two chunks in flight: the node's and the network's work overlap",
          old=X5_TAIL, new=code("""
              padded = np.concatenate([flat, np.zeros((-flat.size) % (2 * m), flat.dtype)])
              rs = [mp.reduce_scatter(p, group=in_node, async_op=True)
                    for p in np.array_split(padded, 2)]
              ar = [mp.all_reduce(w.wait(), group=across, async_op=True) for w in rs]
              ag = [mp.all_gather(w.wait(), group=in_node, async_op=True) for w in ar]
              return np.concatenate([w.wait() for w in ag])[: flat.size]
              """)),
]

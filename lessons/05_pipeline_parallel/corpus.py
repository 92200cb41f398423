"""Lesson 05's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 8) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
WARMUP = line("warmup = min(pp - r - 1, m)  # Megatron: p - r - 1 forwards before the first B")
COOLDOWN = line("row += [Action(r, B, i) for i in range(m - warmup, m)]  # cool-down")
BODY_51 = (WARMUP + line("row = [Action(r, F, i) for i in range(warmup)]")
           + line("for i in range(m - warmup):  # steady state: one forward, one backward")
           + line("row += [Action(r, F, warmup + i), Action(r, B, i)]", 12) + COOLDOWN)
PEERS = (line("prev = group.ranks[r - 1] if r > 0 else None  # global ranks of my neighbours", 4)
         + line("nxt = group.ranks[r + 1] if r + 1 < p else None", 4))
SEND_F = line("pending.append(mp.isend(y, nxt, group=group))", 16)
SEND_B = line("pending.append(mp.isend(dx, prev, group=group))", 16)
PENDING = line("pending = []  # isends: waited once the list has run (the lowering's contract)", 4)
RECV_B = line("dy = mp.recv(nxt, group=group) if nxt is not None else None  # dy: [b, h]", 12)
PLAN_LOOPS = (line("for v in range(1, cfg.num_layers // pp + 1):  # fewest chunks first: v x "
                   "the messages", 4)
              + line('name = "1f1b" if v == 1 else "interleaved_1f1b"')
              + line("for m in range(1, global_batch + 1):  # fewest micro-batches first: "
                     "larger kernels"))
PLAN_SKIP = (line("if global_batch % m or (v > 1 and m % pp):", 12)
             + line("continue  # micro-batches of whole sequences; Megatron's m % p == 0", 16))


def plan(name: str, m: str, v: str = "1") -> str:
    return (PLAN_LOOPS.split("\n")[0] + "\n"
            + line(f'return {{"schedule": "{name}", "microbatches": {m}, "chunks": {v}}}'))


BODY_53_START = PLAN_LOOPS.split("\n")[0] + "\n"

LIMITS = ["over 1F1B's bound min(p - r, m)"]

WRONG = [
    # 5.1 the 1F1B generator
    wrong("5.1", "misconception", "GPipe's order: every forward, then every backward",
          old=BODY_51, new=line("row = [Action(r, F, i) for i in range(m)]")
          + line("row += [Action(r, B, i) for i in range(m)]"),
          hint=LIMITS + ["GPipe's order (every forward before any backward)",
                         "smallest failing configuration: p=2, m=2"]),
    wrong("5.1", "misconception", "torch's p - r warm-up forwards, then Megatron's F-then-B "
          "pairs", old=WARMUP, new=line("warmup = min(pp - r, m)  # torch: p - r warm-up"),
          hint=LIMITS + ["your ranks run [5, 4, 3, 2] forwards", "off by one",
                         "torch's Schedule1F1B says it warms up with p - r"]),
    wrong("5.1", "misconception", "the same warm-up, p - 1 forwards, on every rank",
          old=WARMUP, new=line("warmup = min(pp - 1, m)  # fill the whole pipeline first"),
          hint=LIMITS + ["your ranks run [4, 4, 4, 4] forwards", "Every rank runs the same warm-up"]),
    wrong("5.1", "misconception", "warm-up r: the first stage starts its backwards first",
          old=WARMUP, new=line("warmup = min(r, m)  # stage r waits for r stages before it"),
          hint=["the schedule can never finish",
                "rank r can run at most p - r - 1 forwards before its first backward"]),
    wrong("5.1", "misconception", "no warm-up: one micro-batch in flight, the least memory",
          old=WARMUP, new=line("warmup = 0  # F, B, F, B: one micro-batch at a time"),
          hint=["GPipe's takes (m + p - 1)(t_F + t_B)", "not (p - 1)/m",
                "leave the pipeline unfilled"]),
    wrong("5.1", "misconception", "forgets the cool-down backwards", old=COOLDOWN,
          new=line("pass  # the steady state ran every micro-batch"),
          hint=["the validator refuses it", "never runs 0B0",
                "every (stage, micro-batch) is computed once per kind"]),
    wrong("5.1", "small-only", "warm-up p - r - 1 without min(., m): breaks when m < p - 1",
          old=WARMUP, new=line("warmup = pp - r - 1  # Megatron's warm-up"),
          hint=["smallest failing configuration: p=3, m=1"]),
    wrong("5.1", "small-only", "worked out on 2 ranks: every rank but the last one "
          "forward ahead", old=WARMUP,
          new=line("warmup = min(1 if r < pp - 1 else 0, m)  # one forward ahead"),
          hint=["GPipe's takes (m + p - 1)(t_F + t_B)",
                "smallest failing configuration: p=3"]),
    # 5.2 a pipeline rank over send/recv
    wrong("5.2", "misconception", "blocking sends, as the forward chain seems to allow",
          edits=[(SEND_F, line("mp.send(y, nxt, group=group)", 16)),
                 (SEND_B, line("mp.send(dx, prev, group=group)", 16))],
          hint=["deadlock (DeadlockError) running 1f1b on p = 2 ranks with m = 2",
                "send blocks until the receiver posts its recv",
                "Post every send with mp.isend",
                "smallest failing configuration: p=2, m=2, name='1f1b'"]),
    wrong("5.2", "misconception", "neighbours as global ranks r - 1 and r + 1",
          old=PEERS, new=line("me = mp.get_rank()  # my global rank", 4)
          + line("prev = me - 1 if r > 0 else None", 4)
          + line("nxt = me + 1 if r + 1 < p else None", 4),
          hint=["needs another member of group", "strided=True"]),
    wrong("5.2", "misconception", "gradients received from the previous rank, as activations",
          old=RECV_B, new=line("dy = mp.recv(prev, group=group) if prev is not None else "
                               "None", 12),
          hint=["stage 0's output gradient of micro-batch 0 got None", "group.ranks[r + 1]",
                "smallest failing configuration: p=2, m=1"]),
    wrong("5.2", "misconception", "never waits on its isends: they are sent anyway",
          old=line("for work in pending:", 4) + line("work.wait()", 8),
          new=line("pass  # isend sends by itself", 4),
          hint=["returned while a send it posted was still in flight",
                "wait on every isend's Work"]),
    wrong("5.2", "small-only", "written for two ranks: rank 0 sends, rank 1 computes the "
          "loss", old=PEERS, new=line("prev = group.ranks[0] if r == 1 else None  # 0 -> 1", 4)
          + line("nxt = group.ranks[1] if r == 0 else None", 4),
          hint=["got None, expected an array", "group.ranks[r + 1]",
                "smallest failing configuration: p=3"]),
    # 5.3 the plan within two budgets
    wrong("5.3", "misconception", "GPipe with many micro-batches: more m, less bubble",
          old=BODY_53_START, new=plan("gpipe", "global_batch"),
          hint=["the activation peak of gpipe with m = 32", "over its budget of 700 kB",
                "the whole batch's activations whatever m is"]),
    wrong("5.3", "misconception", "m = p fills the pipeline", old=BODY_53_START,
          new=plan("1f1b", "pp"),
          hint=["the bubble of 1f1b with m = 4", "over its budget of 25 %",
                "(p - 1)/(v·m) = 3/4"]),
    wrong("5.3", "misconception", "interleaving with m not a multiple of p",
          old=BODY_53_START, new=plan("interleaved_1f1b", "2", "2"),
          hint=["is refused", "microbatches must be a multiple of pp = 4"]),
    wrong("5.3", "small-only", "m from the bubble formula alone: ceil((p - 1)/target)",
          old=BODY_53_START, new=line("import math", 4)
          + line("m = math.ceil((pp - 1) / bubble_target)  # (p - 1)/m <= target", 4)
          + line('return {"schedule": "1f1b", "microbatches": m, "chunks": 1}', 4)
          + BODY_53_START,
          hint=["m = 12 micro-batches do not divide the global batch of 32 sequences"]),
    wrong("5.3", "small-only", "the lesson's pipeline worked out by hand: 1F1B, m = 16",
          old=BODY_53_START, new=plan("1f1b", "16"),
          hint=["8 layers on 4 ranks, 16 sequences, a 10 % bubble",
                "the bubble of 1f1b with m = 16", "interleave v chunks"]),
]

RIGHT = [
    right("a blocking send for activations, isend for gradients: in 1F1B rank r + 1 "
          "receives micro-batch i + 1 before it sends gradient i back",
          old=SEND_F, new=line("mp.send(y, nxt, group=group)", 16)),
    right("torch's loop: min(p - r, m) forwards, then B and F alternating; and the plan with "
          "the most micro-batches, then the fewest chunks", edits=[
              (BODY_51, line("f = min(pp - r, m)  # forwards before the first backward")
               + line("row = [Action(r, F, i) for i in range(f)]")
               + line("for i in range(m):  # one backward, then a forward if any is left")
               + line("row.append(Action(r, B, i))", 12)
               + line("if f < m:", 12)
               + line("row.append(Action(r, F, f))", 16)
               + line("f += 1", 16)),
              (PLAN_LOOPS, line("for v in range(1, cfg.num_layers // pp + 1):", 4)
               + line('name = "1f1b" if v == 1 else "interleaved_1f1b"')
               + line("for m in range(global_batch, 0, -1):  # the most micro-batches")),
          ]),
    right("a 1F1B built by a rule: forward while fewer than min(p - r, m) are in flight",
          old=BODY_51, new=line("f = b = 0  # forwards and backwards emitted")
          + line("row = []")
          + line("while b < m:")
          + line("if f < m and f - b < min(pp - r, m):  # room for another micro-batch", 12)
          + line("row.append(Action(r, F, f))", 16)
          + line("f += 1", 16)
          + line("else:", 12)
          + line("row.append(Action(r, B, b))", 16)
          + line("b += 1", 16)),
    right("a pipeline rank with one send in the air per neighbour: each isend waited "
          "before the next one to that neighbour", edits=[
              (PENDING, PENDING + line("last = {}  # neighbour -> its latest isend", 4)),
              (SEND_F, line("if nxt in last:  # one message in the air per neighbour", 16)
               + line("last[nxt].wait()", 20)
               + line("last[nxt] = mp.isend(y, nxt, group=group)", 16)
               + line("pending.append(last[nxt])", 16)),
              (SEND_B, line("if prev in last:", 16) + line("last[prev].wait()", 20)
               + line("last[prev] = mp.isend(dx, prev, group=group)", 16)
               + line("pending.append(last[prev])", 16))]),
]

"""Lesson 06's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 4) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
DG = line("dg = linear_backward_input(dy, mlp.fc2.weight.data, mlp.fc2.name)  # dg: [..., ffn]")
DX = line("dx = linear_backward_input(du, mlp.fc1.weight.data, mlp.fc1.name)  # dx: [..., h]")
KEPT = line("return dx, (dy, s2, du, s1)  # each linear's output gradient and saved input")
W_START = line("dy, s2, du, s1 = kept")
DY2 = line("dy2 = dy.reshape(-1, dy.shape[-1])  # dy2: [N, h]")
DW2 = line('dw2 = matmul(dy2.T, g2, label=f"{mlp.fc2.name}.wgrad")  # dw2: [h, ffn]')
DW1 = line('dw1 = matmul(du2.T, x2, label=f"{mlp.fc1.name}.wgrad")  # dw1: [ffn, h]')
RELEASE = line("s1.release()") + line("s2.release()")
W_RETURN = line("return dw1, du2.sum(axis=0), dw2, dy2.sum(axis=0)")
W_BODY = (W_START + DY2 + line("g2 = s2.x.reshape(-1, s2.x.shape[-1])  # g2: [N, ffn]")
          + line("du2 = du.reshape(-1, du.shape[-1])  # du2: [N, ffn]")
          + line("x2 = s1.x.reshape(-1, s1.x.shape[-1])  # x2: [N, h]") + DW2 + DW1 + RELEASE
          + W_RETURN)

AFTER_I = line("row.append(Action(r, I, k))  # the previous stage waits for this one", 12)
DEFER = (line("if k >= r:  # rank r keeps r W's back for its cool-down", 12)
         + line("row.append(Action(r, W, done))", 16) + line("done += 1", 16))
WARMUP = line("warmup = min(pp - r - 1, m)  # 1F1B's warm-up: p - r - 1 forwards", 8)

PLAN_START = line("plans = [(name, v) for name, v in CHOICES.items() if v] + "
                  "[(\"interleaved_1f1b\", 2)]")


def plan(name: str, m: str, v: str = "1") -> str:
    return line(f'return {{"schedule": "{name}", "microbatches": {m}, "chunks": {v}}}') \
        + PLAN_START


MOST = "global_batch // min_microbatch"

WRONG = [
    # 6.1 the split backward
    wrong("6.1", "misconception", "I runs each linear's fused backward: dW with dx",
          edits=[(DG, line("from minipar.nn.linear import linear_backward")
                  + line("dg, dw2, db2 = linear_backward(dy, s2, mlp.fc2.weight.data, True)")),
                 (DX, line("dx, dw1, db1 = linear_backward(du, s1, mlp.fc1.weight.data, True)")),
                 (KEPT, line("return dx, (dw1, db1, dw2, db2)")),
                 (W_BODY, line("return kept  # I computed them already"))],
          hint=["I charged", "for weight gradients", "belong to W: nobody upstream waits"]),
    wrong("6.1", "misconception", "W calls each Linear's own backward for its gradients",
          old=W_BODY, new=W_START
          + line("mlp.fc2.backward(dy, s2)  # accumulates dW2, db2 (and frees s2)")
          + line("mlp.fc1.backward(du, s1)")
          + line("return tuple(p.grad for p in (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, "
                 "mlp.fc2.bias))"),
          hint=["W recomputed input gradients", "a Linear's own backward computes dx"]),
    wrong("6.1", "misconception", "keeps every output gradient of the chain, dg too",
          edits=[(KEPT, line("return dx, (dy, s2, du, s1, dg)  # all of the backward's tensors")),
                 (W_START, line("dy, s2, du, s1, dg = kept"))],
          hint=["bytes wait for W", "W needs", "8·N·(2h + 2ffn)", "dg, for one, is I's alone"]),
    wrong("6.1", "misconception", "keeps the whole saved tuple, for W to release at once",
          edits=[(line("du = gelu_backward(dg, s_act)  # du: [..., ffn]; frees u, which W "
                       "does not need"),
                  line("from minipar.nn import Saved")
                  + line("du = gelu_backward(dg, Saved('gelu', x=s_act.x, approximate=mlp.gelu))")),
                 (KEPT, line("return dx, (dy, s2, du, s1, s_act)  # W releases all three")),
                 (W_START, line("dy, s2, du, s1, s_act = kept")),
                 (RELEASE, RELEASE + line("s_act.release()"))],
          hint=["bytes wait for W", "The GeLU's input u [..., ffn] is I's alone"]),
    wrong("6.1", "misconception", "W never gives the saved inputs back to the ledger",
          old=RELEASE, new=line("pass  # the gradients are computed: done"),
          hint=["after W the ledger still holds", "Saved.release"]),
    wrong("6.1", "small-only", "flattens dy with the input's width (right when in = out)",
          old=DY2, new=line("dy2 = dy.reshape(-1, s2.x.shape[-1])  # dy2: [N, h]"),
          hint=["mlp_backward_weight", "smallest failing configuration", "wide=2"]),
    wrong("6.1", "small-only", "dyᵀ·x on the arrays as given: right for [N, h] tokens only",
          edits=[(DW2, line('dw2 = matmul(dy.T, s2.x, label=f"{mlp.fc2.name}.wgrad")')),
                 (DW1, line('dw1 = matmul(du.T, s1.x, label=f"{mlp.fc1.name}.wgrad")'))],
          hint=["smallest failing configuration", "shape='[s, b, h]'"]),
    # 6.2 the ZB-H1 generator
    wrong("6.2", "misconception", "each W straight after its I: a split 1F1B",
          old=DEFER, new=line("row.append(Action(r, W, k))  # W at once", 12)
          + line("done += 1", 12),
          hint=["ZB-H1's bubble is (p - 1)(t_F + t_B - 2 t_W)", "leave at most [0, 0] W's",
                "fewer leaves the cool-down's idle slots empty",
                "smallest failing configuration: p=2, m=2"]),
    wrong("6.2", "misconception", "every W deferred to the end of the step",
          old=DEFER, new=line("pass  # every W waits for the cool-down", 12),
          hint=["leave at most [1, 1] W's", "More holds more activations than 1F1B's peak"]),
    wrong("6.2", "misconception", "the first rank has the longest cool-down, so it defers "
          "the most W's", old=DEFER,
          new=line("if k >= pp - r - 1:  # rank 0 keeps p - 1 W's back", 12)
          + line("row.append(Action(r, W, done))", 16) + line("done += 1", 16),
          hint=["More holds more activations than 1F1B's peak", "ZB-H1's rank r leaves r"]),
    wrong("6.2", "misconception", "W before its I: the weights first",
          edits=[(AFTER_I, line("row.append(Action(r, W, k))  # weights first", 12)
                  + line("row.append(Action(r, I, k))", 12)), (DEFER, line("done += 1", 12))],
          hint=["the validator refuses it", "W (weight gradients) follows I"]),
    wrong("6.2", "small-only", "warm-up p - r - 1 without min(., m): breaks when m < p - 1",
          old=WARMUP, new=line("warmup = pp - r - 1  # 1F1B's warm-up", 8),
          hint=["smallest failing configuration: p=3, m=1"]),
    wrong("6.2", "small-only", "worked out on 2 ranks: every rank but the first defers one W",
          old=line("if k >= r:  # rank r keeps r W's back for its cool-down", 12),
          new=line("if k >= min(r, 1):  # one W back", 12),
          hint=["ZB-H1's bubble is (p - 1)(t_F + t_B - 2 t_W)",
                "smallest failing configuration: p=3"]),
    # 6.3 the plan within two budgets
    wrong("6.3", "misconception", "1F1B with the most micro-batches", old=PLAN_START,
          new=plan("1f1b", MOST),
          hint=["the bubble of 1f1b with m = 16", "1F1B idles (p - 1)(t_F + t_B)"]),
    wrong("6.3", "misconception", "ZB-H2: the zero-bubble schedule, whatever the memory",
          old=PLAN_START, new=plan("zb_h2", MOST),
          hint=["the activation peak of zb_h2 with m = 16",
                "ZB-H2 buys its zero bubble with 2p - 1"]),
    wrong("6.3", "misconception", "DualPipeV with m = p micro-batches", old=PLAN_START,
          new=plan("dualpipev", "pp", "2"),
          hint=["is refused", "dualpipev needs at least 2p = 8 micro-batches"]),
    wrong("6.3", "small-only", "the lesson's puzzle worked out by hand: ZB-H1, m = 16",
          old=PLAN_START, new=plan("zb_h1", MOST),
          hint=["back-to-back steps", "the bubble of zb_h1 with m = 16",
                "ZB-H1's bubble is (p - 1)(t_F + t_B - 2 t_W) in every step"]),
]

RIGHT = [
    right("I and W through minipar's own split: a WeightGradStore", edits=[
        (DG + line("du = gelu_backward(dg, s_act)  # du: [..., ffn]; frees u, which W does "
                   "not need") + DX + KEPT,
         line("from minipar.nn import WeightGradStore")
         + line("store = WeightGradStore()  # what W will read, on the ledger")
         + line("return mlp.backward(dy, saved, store=store), store")),
        (W_BODY, line("kept.run()  # W: every deferred record, then released")
         + line("return tuple(p.grad for p in (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, "
                "mlp.fc2.bias))"))]),
    right("W through the library's half, linear_backward_weight; ZB-H1 with each deferred "
          "W run before the next forward", edits=[
              (W_BODY, W_START + line("from minipar.nn.linear import linear_backward_weight")
               + line("dw2, db2 = linear_backward_weight(dy, s2.x, True, mlp.fc2.name)")
               + line("dw1, db1 = linear_backward_weight(du, s1.x, True, mlp.fc1.name)")
               + RELEASE + line("return dw1, db1, dw2, db2")),
              (line("if warmup + k < m:", 12), line("if k > r and done < k:  # W first", 12)
               + line("row.append(Action(r, W, done))", 16) + line("done += 1", 16)
               + line("if warmup + k < m:", 12)),
              (DEFER, ""),
          ]),
    right("ZB-V, 1F1B's memory and no bubble between steps, at the most micro-batches",
          old=PLAN_START, new=plan("zbv", MOST, "2")),
]

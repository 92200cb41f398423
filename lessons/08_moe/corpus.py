"""Lesson 08's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 4) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
FLAT = line("flat = experts.reshape(-1)  # flat: [T·k], pair p = t·k + j")
ORDER = line('order = np.argsort(flat, kind="stable")  # by expert; equal experts keep token order')
GATHER_X = line("xs = x[order // k]  # xs: [T·k, h], row r holds the token of pair order[r]")
COUNTS = line("counts = np.bincount(flat, minlength=num_experts)  # counts: [E]")
SCATTER = (line("per_pair = np.empty_like(ys)  # per_pair: [T·k, h] in pair order")
           + line("per_pair[order] = ys  # the inverse permutation: a scatter"))
COMBINE = line('return np.einsum("tk,tkh->th", weights, per_pair.reshape(T, k, -1))  # y: [T, h]')

CAP = line("C = math.ceil(k * T / num_experts * capacity_factor)  # pairs an expert takes at most")
BY_WEIGHT = line("rank = np.lexsort((t, -weights[t, j]))  # highest weight first, then token", 12)
POLICY = line('if drop_policy == "probs":', 8)
KEEP = line("keep = rank[:C]", 8)

REDUCE = (line('mean_over_replicas = mp.all_reduce(grad, "avg", group=groups.edp)  # same expert, dp/ep')
          + line("return mean_over_replicas / dims.ep  # each replica's gradient summed ep shares"))


def reduced(*lines: str) -> str:
    return "".join(line(text) for text in lines)


WRONG = [
    # 8.1 the dispatch permutation and its inverse
    wrong("8.1", "misconception", "rows left in token order: each token's k copies in turn",
          old=ORDER, new=line("order = np.arange(T * k)  # pair order"),
          hint=["your rows are in token order", "group them by expert"]),
    wrong("8.1", "misconception", "np.argsort's default sort, taken to be stable",
          old=ORDER, new=line("order = np.argsort(flat)  # by expert"),
          hint=["not in token order", 'kind="stable"']),
    wrong("8.1", "misconception", "experts flattened column-major: pairs by choice slot first",
          edits=[(FLAT, line("flat = experts.T.reshape(-1)  # pair p = j·T + t")),
                 (GATHER_X, line("xs = x[order % T]"))],
          hint=["column-major flatten", "t·k + j"]),
    wrong("8.1", "misconception", "counts from np.bincount without minlength",
          old=COUNTS, new=line("counts = np.bincount(flat)"),
          hint=["permute_rows' counts", "minlength=E"]),
    wrong("8.1", "misconception", "the inverse read as a gather, ys[order]",
          old=SCATTER, new=line("per_pair = ys[order]"),
          hint=["a gather", "is a scatter"]),
    wrong("8.1", "small-only", "the k outputs summed without weights: right for top-1",
          old=COMBINE, new=line("return per_pair.reshape(T, k, -1).sum(axis=1)"),
          hint=["without its routing weights"]),
    # 8.2 capacity and dropped pairs
    wrong("8.2", "misconception", "drops by position whatever the policy",
          old=POLICY, new=line('if drop_policy == "by weight":', 8),
          hint=["you kept by 'position' where 'probs' was asked"]),
    wrong("8.2", "misconception", "no capacity: every pair kept",
          old=KEEP, new=line("keep = rank", 8), hint=["kept every pair"]),
    wrong("8.2", "misconception", "the capacity rounded down by int()",
          old=CAP, new=line("C = int(k * T / num_experts * capacity_factor)"),
          hint=["rounded down", "where C = ceil(k·T/E · factor)"]),
    wrong("8.2", "misconception", "ties in weight to the later token",
          old=BY_WEIGHT, new=line("rank = np.lexsort((-t, -weights[t, j]))", 12),
          hint=["Among equal weights the earlier token is kept"]),
    wrong("8.2", "small-only", "the capacity without the k: right for top-1",
          old=CAP, new=line("C = math.ceil(T / num_experts * capacity_factor)"),
          hint=["without the k", "C counts (token, choice) pairs"]),
    # 8.3 an expert's gradient under dp × ep
    wrong("8.3", "misconception", "averaged over the expert's replicas, the 1/ep forgotten",
          old=REDUCE, new=reduced('return mp.all_reduce(grad, "avg", group=groups.edp)'),
          hint=["received = ep×", "scale it by 1/ep"]),
    wrong("8.3", "misconception", "the replicas' sum divided by the edp size, not by dp",
          old=REDUCE, new=reduced('total = mp.all_reduce(grad, "sum", group=groups.edp)',
                                  "return total / groups.edp.size"),
          hint=["received = ep×", "dividing the sum by the edp size"]),
    wrong("8.3", "misconception", "averaged over the whole dp group, as a dense parameter",
          old=REDUCE, new=reduced('return mp.all_reduce(grad, "avg", group=groups.dp) / dims.ep'),
          hint=["beyond the expert's replicas", "hold other experts"]),
    wrong("8.3", "misconception", "averaged over the ep group",
          old=REDUCE, new=reduced('return mp.all_reduce(grad, "avg", group=groups.ep) / dims.ep'),
          hint=["ran over the ep group", "hold the other experts"]),
    wrong("8.3", "small-only", "only the 1/ep, no all-reduce: right when ep = dp",
          old=REDUCE, new=reduced("return grad / dims.ep"),
          hint=["no collective ran", "average over them (the edp group)"]),
]

RIGHT = [
    right("the rows sorted by (expert, token) with np.lexsort; the inverse as a gather by "
          "the inverse permutation",
          edits=[(ORDER, line("order = np.lexsort((np.arange(T * k) // k, flat))  # expert, token")),
                 (SCATTER, line("per_pair = ys[np.argsort(order)]  # inverse: row of each pair"))]),
    right("each expert's pairs ranked with sorted() on (-weight, token)",
          old=BY_WEIGHT, new=line("rank = np.array(sorted(range(len(t)), key=lambda i: "
                                  "(-weights[t[i], j[i]], t[i])), dtype=np.int64)", 12)),
    right("the replicas' sum divided by dp",
          old=REDUCE, new=reduced('return mp.all_reduce(grad, "sum", group=groups.edp) / dims.dp')),
]

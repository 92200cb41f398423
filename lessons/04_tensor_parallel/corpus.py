"""Lesson 04's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong

# -- the lines of solution.py the cases patch ----------------------------------------------
COL_FWD = "    return x @ w_shard.T + b_shard  # y_r: [s, b, out/t]\n"
COL_DW = "    dw_shard = dy2.T @ x2  # dw_shard: [out/t, in], complete: only rank r uses W_r\n"
COL_DX = '    dx = mp.all_reduce(dx_partial, "sum", group=group)  # f\'s backward: [s, b, in]\n'
ROW_PARTIAL = "    y_partial = x_shard @ w_shard.T  # y_partial: [s, b, out], a partial sum\n"
ROW_G = '    y = mp.all_reduce(y_partial, "sum", group=group)  # g\'s forward: [s, b, out]\n'
ROW_BIAS = "    return y + b  # after the reduction: once, not t times\n"
ROW_DX = "    dx_shard = dy @ w_shard  # dx_shard: [s, b, in/t]; g's backward is the identity\n"
ROW_DW = "    dw_shard = dy2.T @ x2  # dw_shard: [out, in/t]\n"
CE_RANK = "    t, r = mp.get_world_size(group), mp.get_rank(group)\n"
CE_MAX = ('    m = mp.all_reduce(logits_shard.max(axis=-1), "max", group=group)  # m: [s, b]\n')
CE_LOCAL = "    local = np.where(mine, targets - lo, 0)  # local: int [s, b], safe to index with\n"
CE_SUM = ('    sum_e = mp.all_reduce(np.exp(logits_shard - m[..., None]).sum(axis=-1), "sum",\n')
LN_BWD = "    dx_shard, dgamma, dbeta = layernorm_backward(dy_shard, saved, gamma, eps)\n"
LN_AR = ('    both = mp.all_reduce(np.concatenate([dgamma, dbeta]), "sum", group=group)  # [2h]\n')
LN_RETURN = "    return dx_shard, both[:h], both[h:]\n"
PLAN_TP = "    tp = topology.gpus_per_node  # one node's GPUs: the tp collectives stay on NVLink\n"
PLAN_DIMS = ("    dims = ParallelDims(dp_replicate=topology.world_size // tp, tp=tp)  "
             "# tp fastest: a node\n")
PLAN_SEARCH = '''\
    for sp, recompute in ((False, "none"), (True, "none"), (True, "selective"), (True, "full")):
        per_layer = activation_bytes_per_layer(  # Korthikanti et al.'s Table 2 (section 5)
            s, b, h, a, recompute, act_bytes=cfg.np_dtype.itemsize, dropout=cfg.dropout > 0,
            tp=tp, sequence_parallel=sp)
        if cfg.num_layers * per_layer <= activation_budget:
            break  # the first, cheapest change that fits
    return {"dims": dims, "sequence_parallel": sp, "cfg": cfg.with_(recompute=recompute)}
'''


def plan(sp: str, cfg: str) -> str:
    return f'    return {{"dims": dims, "sequence_parallel": {sp}, "cfg": {cfg}}}\n'


WRONG = [
    # 4.1 the column-parallel layer
    wrong("4.1", "misconception", "forgets f's backward: dx is this rank's dy_r W_r alone",
          old=COL_DX, new="    dx = dx_partial  # every rank already has the whole x\n",
          hint=["ran no collective, expected 1 all-reduce", "f's backward is one all-reduce"]),
    wrong("4.1", "misconception", "all-reduces the column-parallel output in forward",
          old=COL_FWD, new='    return mp.all_reduce(x @ w_shard.T + b_shard, "sum", '
                           'group=group)\n',
          hint=["column_parallel_linear_forward ran ['all_reduce of",
                "f is the identity in forward"]),
    wrong("4.1", "misconception", "all-reduces dx over the whole world, not the group",
          old=COL_DX, new='    dx = mp.all_reduce(dx_partial, "sum")  # [s, b, in]\n',
          hint=["not over `group`", "pass group=group", "raised on tp rank"]),
    wrong("4.1", "misconception", "all-reduces the weight gradient as data parallelism does",
          old=COL_DW, new='    dw_shard = mp.all_reduce(dy2.T @ x2, "sum", group=group)\n',
          hint=["expected 1 all-reduce", "dW_r and db_r are complete on rank r"]),
    wrong("4.1", "misconception", "averages dx over the group",
          old=COL_DX, new='    dx = mp.all_reduce(dx_partial, "sum", group=group) / '
                          'mp.get_world_size(group)\n',
          hint=["received = 1/n (n = 2) expected everywhere: averaged over the group where "
                "f's backward sums"]),
    wrong("4.1", "small-only", "dW_r from a reshape of dy instead of a transpose (one token)",
          old=COL_DW, new="    dw_shard = dy_shard.reshape(dy_shard.shape[-1], -1) @ x2\n",
          hint=["dw_shard of column_parallel_linear_backward",
                "dW_r sums dy_r^T x over the s·b tokens"]),
    # 4.2 the row-parallel layer
    wrong("4.2", "misconception", "adds the bias on every rank before g",
          edits=[(ROW_PARTIAL, "    y_partial = x_shard @ w_shard.T + b  # [s, b, out]\n"),
                 (ROW_BIAS, "    return y\n")],
          hint=["received y = expected + (t − 1)·b", "add it once, after g"]),
    wrong("4.2", "misconception", "all-gathers the partial products, as after a column split",
          old=ROW_G, new="    y = mp.all_gather(y_partial, axis=-1, group=group)\n",
          hint=["row_parallel_linear_forward ran ['all_gather of",
                "each rank's x_r W_r^T is a partial sum of y"]),
    wrong("4.2", "misconception", "all-reduces dx_r in backward, as the column layer's f does",
          old=ROW_DX, new='    dx_shard = mp.all_reduce(dy @ w_shard, "sum", group=group)\n',
          hint=["row_parallel_linear_backward ran ['all_reduce", "g's backward is the "
                "identity"]),
    wrong("4.2", "small-only", "dW_r as the outer product of the token sums (one token)",
          old=ROW_DW, new="    dw_shard = np.outer(dy2.sum(axis=0), x2.sum(axis=0))\n",
          hint=["dw_shard of row_parallel_linear_backward", "token by token"]),
    # 4.3 the vocabulary-parallel loss
    wrong("4.3", "misconception", "the vocabulary offset from the global rank",
          old=CE_RANK, new="    t, r = mp.get_world_size(group), mp.get_rank()\n",
          hint=["on probe logits", "not its global rank", "raised on tp rank 0 of 2 = "
                "global rank 2 of 4, the second tp group [2, 3]"]),
    wrong("4.3", "misconception", "subtracts the max of this rank's shard only",
          old=CE_MAX, new="    m = logits_shard.max(axis=-1)  # m: [s, b]\n",
          hint=["on wide logits", "a max over this rank's shard differs from rank to rank"]),
    wrong("4.3", "misconception", "subtracts the max in place, to save a copy",
          old=CE_SUM, new='    logits_shard -= m[..., None]  # in place: no copy of the '
                          'logits\n    sum_e = mp.all_reduce(np.exp(logits_shard).sum('
                          'axis=-1), "sum",\n',
          hint=["wrote into its input `logits_shard`", "compute into a new array"]),
    wrong("4.3", "misconception", "all-gathers the logits and takes the max of the whole row",
          old=CE_MAX, new="    full = mp.all_gather(logits_shard, axis=-1, group=group)  "
                          "# [s, b, V]\n    m = full.max(axis=-1)  # m: [s, b]\n",
          hint=["ran ['all_gather of", "no rank may gather the logits"]),
    wrong("4.3", "small-only", "no max subtracted: right while exp does not overflow",
          old=CE_MAX, new="    m = np.zeros(targets.shape)  # exp of logits this small "
                          "is safe\n",
          hint=["on extreme logits", "exp overflows past 709.8"]),
    wrong("4.3", "small-only", "one max over all tokens: right while the tokens are alike",
          old=CE_MAX, new='    m = np.full(targets.shape, mp.all_reduce(logits_shard.max(), '
                          '"max", group=group))\n',
          hint=["on extreme logits", "a single maximum over all tokens"]),
    # 4.4 the sequence-parallel LayerNorm
    wrong("4.4", "misconception", "averages the partial sums over the group",
          old=LN_RETURN, new="    t = mp.get_world_size(group)  # the mean over the ranks\n"
                             "    return dx_shard, both[:h] / t, both[h:] / t\n",
          hint=["received = 1/n (n = 2) expected everywhere: averaged over the group"]),
    wrong("4.4", "misconception", "all-reduces dx too, as tensor parallelism's f would",
          old=LN_BWD, new=LN_BWD + '    dx_shard = mp.all_reduce(dx_shard, "sum", '
                                   'group=group)\n',
          hint=["dx needs no communication"]),
    wrong("4.4", "misconception", "all-reduces over the whole world, not the group",
          old=LN_AR, new='    both = mp.all_reduce(np.concatenate([dgamma, dbeta]), "sum")\n',
          hint=["not over `group`", "pass group=group"]),
    wrong("4.4", "small-only", "adds the neighbour's partial sums: right on 2 ranks",
          old=LN_AR, new='''    both = np.concatenate([dgamma, dbeta])  # [2h]: my partial sums
    t, r, ranks = mp.get_world_size(group), mp.get_rank(group), group.ranks
    if t > 1:  # send mine to the next rank, add the previous rank's
        sent = mp.isend(both, ranks[(r + 1) % t])
        both = both + mp.recv(ranks[(r - 1) % t])
        sent.wait()
''',
          hint=["dgamma of sequence_parallel_layernorm_grads", "ALL t ranks of the group",
                "smallest failing configuration: t=3"]),
    # 4.5 the layout within two budgets
    wrong("4.5", "misconception", "the largest tp, every GPU, divides activations the most",
          old=PLAN_TP, new="    tp = topology.world_size  # every GPU: 1/8 of every matrix\n",
          hint=["the lesson's cluster", "tensor-parallel collectives a step",
                "spans nodes [0, 1]", "IB-HDR200"]),
    wrong("4.5", "misconception", "tensor parallelism alone divides every activation by t",
          old=PLAN_SEARCH, new=plan("False", "cfg"),
          hint=["the peak of activations", "over its budget of 700 kB",
                "sequence parallelism is off"]),
    wrong("4.5", "misconception", "switches dropout off: its masks are activations too",
          old=PLAN_SEARCH, new=plan("False", "cfg.with_(dropout=0.0)"),
          hint=["the losses of 2 training steps", "changes what the model computes "
                "(dropout 0.1 -> 0.0)"]),
    wrong("4.5", "misconception", "keeps the activations in bfloat16: half the bytes",
          old=PLAN_SEARCH, new=plan("False", 'cfg.with_(dtype="bfloat16")'),
          hint=["changes what the model computes (dtype 'float64' -> 'bfloat16')"]),
    wrong("4.5", "small-only", "the lesson's cluster worked out by hand: dp 2 x tp 4",
          old=PLAN_DIMS, new="    dims = ParallelDims(dp_replicate=2, tp=4)  # 2 nodes of 4\n",
          hint=["4 nodes x 2 GPUs, 3 layers", "spans nodes [0, 1]"]),
]

PLAN_MEASURED = '''\
    ids = np.zeros((cfg.seq_len, global_batch), dtype=int)  # the bytes do not depend on them

    def peak(ctx, sp, trial):  # one forward and backward, as the grader measures them
        run = parallelize(trial, dims, sequence_parallel=sp, lr=1e-3)
        ctx.ledger.reset_peak()
        base = ctx.ledger.held("activations")
        run.forward_backward(ids, ids)
        return ctx.ledger.peak("activations") - base

    for sp, recompute in ((False, "none"), (True, "none"), (True, "selective")):
        trial = cfg.with_(recompute=recompute)
        peaks = mp.launch(lambda ctx: peak(ctx, sp, trial), topology.world_size,
                          topology=topology)
        if max(peaks) <= activation_budget:
            break
    return {"dims": dims, "sequence_parallel": sp, "cfg": trial}
'''

RIGHT = [
    right("the bias on group rank 0 before g, the target's entry by modulo, two all-reduces "
          "for dgamma and dbeta, and selective recomputation in place of sequence "
          "parallelism", edits=[
              (ROW_PARTIAL, "    first = mp.get_rank(group) == 0  # adds the bias, once\n"
                            "    y_partial = x_shard @ w_shard.T + (b if first else 0)\n"),
              (ROW_BIAS, "    return y\n"),
              (CE_LOCAL, "    local = np.where(mine, targets % per, 0)  # equal shards\n"),
              (LN_AR, '    dgamma = mp.all_reduce(dgamma, "sum", group=group)\n'
                      '    dbeta = mp.all_reduce(dbeta, "sum", group=group)\n'
                      "    both = np.concatenate([dgamma, dbeta])\n"),
              (PLAN_SEARCH, plan("False", 'cfg.with_(recompute="selective")'))]),
    right("the layout chosen by measuring each candidate's activations on the simulated "
          "cluster instead of estimating them", edits=[
              ("from minipar.parallel import ParallelDims\n",
               "from minipar.parallel import ParallelDims, parallelize\n"),
              (PLAN_SEARCH, PLAN_MEASURED)]),
]

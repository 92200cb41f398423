"""Lesson 07's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 4) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
STRIDE = line('stride = {"tp": 1, "dp": dims.tp, "pp": dims.tp * dims.dp}  # tp fastest, pp slowest')
GROUPS_BODY = (line('size = {"tp": dims.tp, "dp": dims.dp, "pp": dims.pp}') + STRIDE
               + line("out = {}") + line('for name in ("tp", "dp", "pp"):')
               + line("coord = rank // stride[name] % size[name]  # this rank's coordinate "
                      "along name", 8)
               + line("base = rank - coord * stride[name]  # the group's member at coordinate 0", 8)
               + line("out[name] = [base + i * stride[name] for i in range(size[name])]", 8)
               + line("return out"))
SEARCH = line("# the checklist: tp inside a node (largest first), pp next, dp last, ZeRO on top")


def fixed(dims: str, zero: int, m: int) -> str:
    """place_layout returning one layout whatever it is asked."""
    return SEARCH + line(f'return {{"dims": {dims}, "zero": {zero}, "microbatches": {m}}}')


WRONG = [
    # 7.1 a rank's groups
    wrong("7.1", "misconception", "dp varies fastest (PyTorch's mesh read backwards)",
          old=STRIDE, new=line('stride = {"tp": dims.dp, "dp": 1, "pp": dims.tp * dims.dp}'),
          hint=["your tp group is not consecutive ranks", "tp varies fastest"]),
    wrong("7.1", "misconception", "pp inside dp: the strides of dp and pp swapped",
          old=STRIDE, new=line('stride = {"tp": 1, "dp": dims.tp * dims.pp, "pp": dims.tp}'),
          hint=["strides of dp and pp are swapped"]),
    wrong("7.1", "misconception", "an off-by-one in the pp stride: tp·dp + 1",
          old=STRIDE, new=line('stride = {"tp": 1, "dp": dims.tp, "pp": dims.tp * dims.dp + 1}'),
          hint=["your pp group steps by", "pp's stride is tp·dp"]),
    wrong("7.1", "small-only", "pp's stride written 2·tp: right when dp = 2 (all sizes 2)",
          old=STRIDE, new=line('stride = {"tp": 1, "dp": dims.tp, "pp": 2 * dims.tp}'),
          hint=["pp's stride is tp·dp"]),
    wrong("7.1", "misconception", "dp counted as dp_shard alone (HYBRID_SHARD's replicas lost)",
          old=line('size = {"tp": dims.tp, "dp": dims.dp, "pp": dims.pp}'),
          new=line('size = {"tp": dims.tp, "dp": dims.dp_shard, "pp": dims.pp}'),
          hint=["a dp group holds dp =", "dp_replicate x dp_shard"]),
    # 7.2 a placed layout
    wrong("7.2", "misconception", "tp across nodes: pp varies fastest (order pp-dp-tp)",
          old=SEARCH, new=fixed('ParallelDims(dp_shard=2, pp=2, tp=2, order="pp-dp-tp")', 1, 2),
          hint=["spans nodes", "belongs inside a node"]),
    wrong("7.2", "misconception", "plain DDP under a 2 x 2 x 2 layout: over memory",
          old=SEARCH, new=fixed("ParallelDims(dp_replicate=2, pp=2, tp=2)", 0, 2),
          hint=["over memory", "ZeRO-1/2 shard the optimizer states"]),
    wrong("7.2", "misconception", "data parallelism alone with ZeRO-2 (the small-model rule)",
          old=SEARCH, new=fixed("ParallelDims(dp_shard=8)", 2, 1),
          hint=["the batch is not divisible", "choose dp (and m) dividing the batch"]),
    wrong("7.2", "misconception", "tp = GPUs a node, pp = nodes, whatever the bytes",
          old=SEARCH, new=SEARCH + line("dims = ParallelDims(pp=topology.num_nodes, "
                                        "tp=topology.gpus_per_node)")
          + line('return {"dims": dims, "zero": 0, "microbatches": 2}'),
          hint=["inter-node links", "pp sends"]),
    wrong("7.2", "small-only", "the answer for 2 nodes of 4 GPUs, whatever the cluster",
          old=SEARCH, new=fixed("ParallelDims(dp_shard=2, pp=2, tp=2)", 1, 2),
          hint=["4 nodes of 2 GPUs", "over its budget", "by group"]),
]

PP_CROSS = line("if k + 1 < len(pp_group) and topology.node_of(rank) != topology.node_of("
                "pp_group[k + 1]):", 8)
PP_ADD = line("total += 2 * microbatches * message  # activations forward, their gradients back", 12)
WRONG += [
    # 7.3 the pipeline's bytes across nodes
    wrong("7.3", "misconception", "only the forward's activations cross",
          old=PP_ADD, new=line("total += microbatches * message", 12),
          hint=["the backward sends each activation's gradient back"]),
    wrong("7.3", "misconception", "every stage boundary crosses nodes",
          old=PP_CROSS, new=line("if k + 1 < len(pp_group):", 8),
          hint=["counted every boundary", "different nodes"]),
    wrong("7.3", "misconception", "each tp rank sends 1/tp of the activation",
          old=PP_ADD, new=line("total += 2 * microbatches * message / dims.tp", 12),
          hint=["divided by tp", "every tp rank sends the whole"]),
    wrong("7.3", "small-only", "one boundary crosses, the middle one: right for pp = 2 on 2 nodes",
          old=PP_CROSS, new=line("if k == len(pp_group) // 2 - 1:", 8),
          hint=["crossing (rank, next stage) pairs' worth",
                "boundary crosses nodes when node_of(rank) differs"]),
]

RIGHT = [
    right("the groups as slices of np.arange(world).reshape(pp, dp, tp)",
          old=GROUPS_BODY,
          new=line("grid = np.arange(dims.world_size).reshape(dims.pp, dims.dp, dims.tp)")
          + line("p, d, t = (int(c) for c in np.argwhere(grid == rank)[0])  # pp, dp, tp coordinates")
          + line('return {"tp": grid[p, d, :].tolist(), "dp": grid[p, :, t].tolist(),')
          + line('        "pp": grid[:, d, t].tolist()}')),
    right("ZeRO-2 first and the smallest tp first: another layout that fits",
          edits=[(line("for tp in [t for t in range(g, 0, -1) if g % t == 0 and "
                       "cfg.num_heads % t == 0]:"),
                  line("for tp in [t for t in range(1, g + 1) if g % t == 0 and "
                       "cfg.num_heads % t == 0]:")),
                 (line("for zero in (0, 1, 2) if dp > 1 else (0,):", 12),
                  line("for zero in (2, 1) if dp > 1 else (0,):", 12))]),
    right("the crossing boundaries counted from each stage's first rank, pp group by pp group",
          old=PP_CROSS + PP_ADD,
          new=line("nxt = rank + dims.tp * dims.dp  # the next stage's rank: pp's stride", 8)
          + line("if k + 1 < dims.pp and topology.node_of(rank) != topology.node_of(nxt):", 8)
          + line("total += 2 * microbatches * message", 12)),
]

"""Lesson 10's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 4) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
BYTES = line("w, g, k = 2, (4 if layout.fp32_grads else 2), 12  # bf16 weights, gradients, master + m + v")
ZERO = line("zero = max(layout.zero, 1 if layout.distributed_optimizer else 0)")
PSI = line("psi = L // p * 12 * h * h / t + rows * h + s * h  # layers, embedding, positions")
SPLIT = line("split = t if layout.sequence_parallel else 1  # what SP divides between the blocks")
IN_FLIGHT = line('n = m if layout.schedule == "gpipe" else min(p, m)  # micro-batches in flight on rank 0')
CORE = line('if layout.recompute == "none":', 8)
ACTIVATION = (line('if layout.recompute == "full":')
              + line("A = 2 * sbh / split  # the layer's input alone", 8)
              + line("else:")
              + line("A = sbh * (10 / split + 24 / t)  # between the blocks, and inside them", 8)
              + line('if layout.recompute == "none":', 8)
              + line("A += 5 * a * s * s * b / t  # the attention core's scores, softmax and mask", 12))

BUBBLE = line("bubble = (p - 1) / (v * m)  # over the ideal time")
IDLE = line("idle = (p - 1) / (v * m + p - 1)  # of the makespan")
RING = line("return steps * ((n - 1) * link.latency + (n - 1) / n * S / link.bandwidth)", 8)
SHARDED = line("sharded = layout.zero >= 1 or layout.distributed_optimizer")
ONE_NODE = line("if nodes == 1:", 8)
ONE_A_NODE = line("elif per_node == 1:", 8)
DP_BLOCK = (line("if dp == 1:")
            + line("dp_seconds = 0.0", 8)
            + line("else:")
            + line("nodes = len({i * t // g for i in range(dp)})", 8)
            + line("per_node = dp // nodes", 8)
            + ONE_NODE
            + line("dp_seconds = ring(S, dp, nv, not sharded)", 12)
            + ONE_A_NODE
            + line("dp_seconds = ring(S, dp, ib, not sharded)", 12)
            + line("elif sharded:  # reduce-scatter in the node, then across the nodes on 1/per_node", 8)
            + line("dp_seconds = ring(S, per_node, nv, False) + ring(S / per_node, nodes, ib, False)", 12)
            + line("else:  # reduce-scatter in the node, all-reduce across, all-gather in the node", 8)
            + line("dp_seconds = (2 * ring(S, per_node, nv, False)", 12)
            + line("+ ring(S / per_node, nodes, ib, True))", 26))
FLOPS = line("flops = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))")
SELECTIVE = line('extra = {"none": 0.0, "selective": B * L * 4 * s * s * h,')
MFU = line('return {"bubble_over_ideal": bubble, "idle_share": idle, "dp_seconds": dp_seconds,')
MFU_NEXT = line('"mfu": flops / capacity, "hfu": (flops + extra) / capacity}', 12)

OPTIONS = line("options = []")
FITS = line("if memory.fits:  # checklist 1: memory first, then time", 20)
DEPTHS = line("for pp in range(1, model.layers + 1):", 12)
RECOMPUTE_LOOP = (
    line('for recompute in ("none", "selective", "full"):  # the first that fits', 16)
    + line("layout = Layout(tp=tp, pp=pp, dp=dp, global_batch=global_batch,", 20)
    + line("sequence_parallel=tp > 1, recompute=recompute,", 36)
    + line("zero=3 if pp == 1 else 0, distributed_optimizer=pp > 1)", 36))


WRONG = [
    # 10.1 the busiest rank's memory
    wrong("10.1", "misconception", "16 bytes a parameter: the gradients always in bf16",
          old=BYTES, new=line("w, g, k = 2, 2, 12  # ZeRO's 2 + 2 + 12"),
          hint=["your gradients are 2 bytes a parameter", "18 bytes a parameter, not ZeRO's 16"]),
    wrong("10.1", "misconception", "the micro-batches in flight forgotten: one micro-batch's "
          "activations",
          old=IN_FLIGHT, new=line("n = 1"),
          hint=["you counted one micro-batch's activations", "min(p, m) under 1F1B"]),
    wrong("10.1", "misconception", "activations not divided by t under sequence parallelism",
          old=SPLIT, new=line("split = 1"),
          hint=["not divided by t under sequence parallelism", "34sbh/t"]),
    wrong("10.1", "misconception", "1F1B holds all m micro-batches, as GPipe does",
          old=IN_FLIGHT, new=line("n = m"),
          hint=["that is GPipe's count", "min(p, m)"]),
    wrong("10.1", "small-only", "1F1B holds p micro-batches: right whenever m >= p",
          old=IN_FLIGHT, new=line('n = m if layout.schedule == "gpipe" else p'),
          hint=["you counted p micro-batches in flight under 1F1B", "when m < p"]),
    wrong("10.1", "misconception", "the distributed optimizer left out of the sharding",
          old=ZERO, new=line("zero = layout.zero"),
          hint=["distributed optimizer", "ZeRO-1 by another name"]),
    wrong("10.1", "misconception", "the layers alone, as Figure 1 counts them: no embedding",
          edits=[(PSI, line("psi = L // p * 12 * h * h / t  # the layers")),
                 (line("psi += rows * h  # the first rank is also the last: the untied head", 8),
                  line("pass", 8))],
          hint=["the first stage also holds the embedding ceil(V/t)·h"]),
    wrong("10.1", "misconception", "the attention scores kept under selective recomputation",
          old=CORE, new=line('if layout.recompute in ("none", "selective"):', 8),
          hint=["selective recomputation drops exactly that term"]),
    # 10.2 a step's bubble, its data-parallel reduction, MFU and HFU
    wrong("10.2", "misconception", "the idle share given as (p − 1)/m, the bubble over ideal",
          old=IDLE, new=line("idle = (p - 1) / (v * m)"),
          hint=["that is the bubble over the ideal time", "(p − 1)/(v·m + p − 1)"]),
    wrong("10.2", "misconception", "the bubble over ideal without the interleaved chunks",
          old=BUBBLE, new=line("bubble = (p - 1) / m"),
          hint=["you left the chunks out", "(p − 1)/(v·m)"]),
    wrong("10.2", "misconception", "the data-parallel ring without its 2(n − 1)/n factor",
          old=RING, new=line("return steps * ((n - 1) * link.latency + S / link.bandwidth)", 8),
          hint=["2(n − 1)/n · S a rank"]),
    wrong("10.2", "misconception", "an all-reduce where the optimizer states are sharded",
          old=SHARDED, new=line("sharded = False"),
          hint=["you priced an all-reduce, but the optimizer states are sharded",
                "a reduce-scatter"]),
    wrong("10.2", "small-only", "the dp group priced on NVLink wherever it is: right inside "
          "one node",
          old=ONE_NODE, new=line("if True:", 8),
          hint=["you priced the dp group on NVLink", "InfiniBand"]),
    wrong("10.2", "misconception", "a flat ring over InfiniBand for a group with several "
          "ranks a node",
          old=ONE_A_NODE, new=line("elif True:", 8),
          hint=["you ran a flat ring over InfiniBand", "hierarchical"]),
    wrong("10.2", "misconception", "HFU reported as MFU: the recomputed FLOPs counted",
          old=MFU_NEXT, new=line('"mfu": (flops + extra) / capacity, "hfu": (flops + extra) / capacity}', 12),
          hint=["your MFU counts the recomputed FLOPs: that is HFU"]),
    wrong("10.2", "misconception", "selective recomputation counted as Q Kᵀ alone",
          old=SELECTIVE, new=line('extra = {"none": 0.0, "selective": B * L * 2 * s * s * h,'),
          hint=["reruns Q Kᵀ only", "4·B·s²·h a layer"]),
    wrong("10.2", "misconception", "model FLOPs as 6 · parameters · tokens",
          old=FLOPS, new=line("flops = 6 * model.parameters() * B * s"),
          hint=["you used 6·Ψ·tokens", "the s² matmuls"]),
    # 10.3 a layout that fits and runs near the best
    wrong("10.3", "misconception", "tensor parallelism over every GPU",
          old=OPTIONS,
          new=(line("return Layout(tp=gpus, global_batch=global_batch, sequence_parallel=gpus > 1,")
               + line('recompute="selective", distributed_optimizer=True)', 18)
               + OPTIONS),
          hint=["tp 16 crosses a node of 8 GPUs", "TP inside the node"]),
    wrong("10.3", "misconception", "the fastest layout, its memory never checked",
          old=FITS, new=line("if True:", 20),
          hint=["which does not fit", "Memory first"]),
    wrong("10.3", "misconception", "the steady bytes checked against the device, not the peak",
          old=FITS, new=line("if memory.steady <= memory.capacity:", 20),
          hint=["which does not fit", "its steady bytes", "the peak adds the transients"]),
    wrong("10.3", "misconception", "PP = the number of nodes, TP = 8, DP the rest",
          old=OPTIONS,
          new=(line("nodes = max(1, gpus // cluster.gpus_per_node)  # the checklist, literally")
               + line("return Layout(tp=min(cluster.gpus_per_node, gpus), pp=nodes,")
               + line("global_batch=global_batch, sequence_parallel=True,", 18)
               + line('recompute="selective", distributed_optimizer=True)', 18)
               + OPTIONS),
          hint=["over the search's best", "tensor parallelism's exposed collectives",
                "the pipeline's bubble"]),
    wrong("10.3", "misconception", "data parallelism alone, ZeRO-3 with full recomputation",
          old=OPTIONS,
          new=(line('return Layout(dp=gpus, global_batch=global_batch, recompute="full", zero=3)')
               + OPTIONS),
          hint=["175B", "which does not fit"]),
    wrong("10.3", "small-only", "never a pipeline: right up to 70B",
          old=DEPTHS, new=line("for pp in (1,):", 12),
          hint=["175B", "over the search's best"]),
    wrong("10.3", "misconception", "the planner's own search called",
          old=OPTIONS,
          new=(line("from minipar.plan import search")
               + line("return search(model, gpus, cluster, global_batch, top=1)[0].layout")
               + OPTIONS),
          hint=["choose_layout called plan.search", "the search is what grades you"]),
]

RIGHT = [
    right("activations a layer as Korthikanti et al. write them",
          old=ACTIVATION,
          new=(line('core = 5 * a * s / (h * t) if layout.recompute == "none" else 0.0')
               + line('A = (2 * sbh / split if layout.recompute == "full"')
               + line("else sbh * (10 / split + 24 / t + core))", 9))),
    right("the reduction priced by the runtime's cost model on the planner's group",
          old=DP_BLOCK,
          new=(line("from minipar.runtime.cost import collective_cost")
               + line("ranks = [i * t for i in range(dp)]  # tp fastest: rank 0's dp group")
               + line("topology = cluster.topology(nodes=-(-layout.gpus // g))")
               + line('kind = "reduce_scatter" if sharded else "all_reduce"')
               + line("dp_seconds = (collective_cost(kind, S, ranks, topology).seconds if dp > 1")
               + line("else 0.0)", 14))),
    right("interleaved 1F1B among the layouts considered",
          old=RECOMPUTE_LOOP,
          new=(line('for recompute in ("none", "selective", "full"):  # the first that fits', 16)
               + line('v = 2 if pp > 1 and model.layers % (2 * pp) == 0 and '
                      '(global_batch // dp) % pp == 0 else 1', 20)
               + line("layout = Layout(tp=tp, pp=pp, dp=dp, global_batch=global_batch,", 20)
               + line('schedule="interleaved_1f1b" if v > 1 else "1f1b", chunks=v,', 36)
               + line("sequence_parallel=tp > 1, recompute=recompute,", 36)
               + line("zero=3 if pp == 1 else 0, distributed_optimizer=pp > 1)", 36))),
]

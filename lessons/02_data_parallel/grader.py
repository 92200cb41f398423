"""Grader for lesson 02: your data-parallel pieces against one device and against minipar's
DistributedDataParallel, on tiny float64 GPTs and simulated ranks."""

import numpy as np
from hypothesis import given, strategies as st

import minipar as mp
from minipar.course.grading import SETTINGS, exercise, expect_close, expect_equal, on_ranks
from minipar.data import split_data_parallel
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel import DistributedDataParallel

MIB = 2**20


def tiny(layers: int, tied: bool = False, dtype: str = "float64", hidden: int = 8,
         vocab: int = 16, seq: int = 8) -> GPTConfig:
    return GPTConfig(vocab_size=vocab, seq_len=seq, hidden=hidden, num_heads=2,
                     num_layers=layers, tie_embeddings=tied, dtype=dtype)


def batch(cfg: GPTConfig, columns: int, seed: int):
    """(ids, targets), each [s, columns], from the seed."""
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, cfg.vocab_size, (2, cfg.seq_len, columns)))


def one_device(cfg: GPTConfig, ids, targets):
    """(loss, {name: gradient}) of one device on the whole batch."""
    with mp.device():
        model = GPT(cfg)
        loss = model.loss_and_grad(ids, targets)
        return loss, {p.name: p.grad.copy() for p in model.parameters()}


def cuts(columns: int, seed: int, most: int = 4) -> list[int]:
    """Random sizes (>= 1, at most `most` of them) that add up to `columns`."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, min(columns, most) + 1))
    inner = sorted(rng.choice(np.arange(1, columns), k - 1, replace=False)) if k > 1 else []
    edges = [0, *map(int, inner), columns]
    return [b - a for a, b in zip(edges, edges[1:])]


# ---- 2.1 -----------------------------------------------------------------------------
@exercise("2.1", "average every parameter's gradient over the group")
@SETTINGS
@given(world_size=st.integers(1, 4), per_rank=st.integers(1, 3), two_groups=st.booleans(),
       layers=st.integers(1, 2), tied=st.booleans(), seed=st.integers(0, 2**16))
def check_all_reduce_gradients(impl, world_size, per_rank, two_groups, layers, tied, seed):
    cfg = tiny(layers, tied)
    two_groups = two_groups and world_size % 2 == 0  # ranks [0, N/2) and [N/2, N): two groups
    size = world_size // 2 if two_groups else world_size  # ranks in a data-parallel group
    data = [batch(cfg, size * per_rank, seed + g) for g in range(2)]  # each group's batch
    expected = [one_device(cfg, *d)[1] for d in data]

    def program(ctx):
        g = ctx.rank // size  # which data-parallel group (always 0 without two_groups)
        model = GPT(cfg)
        mine = split_data_parallel(*data[g], ctx.rank % size, size)  # [s, per_rank]
        model.loss_and_grad(*mine)
        if two_groups:
            group = mp.new_group(range(g * size, (g + 1) * size))
            impl.all_reduce_gradients(model, group)
            call = f"all_reduce_gradients(model, group=ranks {list(group.ranks)})"
        else:
            impl.all_reduce_gradients(model)
            call = f"all_reduce_gradients(model) on {world_size} rank(s)"
        for p in model.parameters():
            expect_close(p.grad, expected[g][p.name], rank=ctx.rank,
                         what=f"{p.name}.grad after {call}",
                         hint="each rank's gradient must become the average over the ranks "
                              "of the group (op 'avg', not 'sum'), written into p.grad; "
                              "with a group, pass it to every all_reduce")

    on_ranks(program, world_size)


# ---- 2.2 -----------------------------------------------------------------------------
def sizes_of(cfg: GPTConfig) -> list[int]:
    """Bytes of each parameter, listed unit by unit in model.units() order."""
    with mp.device():
        return [int(p.data.nbytes) for _, ps in GPT(cfg).units() for p in ps]


def ddp_buckets(cfg: GPTConfig, cap_bytes: int):
    """What DistributedDataParallel does with this cap: (buckets as lists of indices in
    units() order, each bucket's units, the order of the backward_post hooks, and for each
    bucket the unit at whose backward_post DDP launched it, `Bucket.launched_after`)."""
    with mp.device():
        model = GPT(cfg)
        params = [p for _, ps in model.units() for p in ps]
        index = {p.name: i for i, p in enumerate(params)}
        ddp = DistributedDataParallel(model, AdamW, bucket_cap_mb=cap_bytes / MIB)
        buckets = [[index[p.name] for p in b.flat.params] for b in ddp.buckets]
        units = [sorted(b.units) for b in ddp.buckets]
        order = []  # the units in the order their backward_post fired
        model.hooks.register("backward_post", order.append)
        ids, targets = batch(cfg, 2, 0)
        model.loss_and_grad(ids, targets)
        after = [b.launched_after for b in ddp.buckets]
    return buckets, units, order, after


MODELS = st.builds(tiny, layers=st.integers(1, 4), tied=st.booleans(),
                   dtype=st.sampled_from(["float64", "float32"]),
                   hidden=st.sampled_from([4, 8, 12]), vocab=st.integers(3, 20),
                   seq=st.integers(2, 8))


def cap_for(sizes: list[int], pick: int, exact: bool) -> int:
    """A cap in bytes: exactly what the last j parameters hold (a bucket boundary), or any
    number up to a little more than the whole model."""
    if exact:
        ends = np.cumsum(sizes[::-1])
        return int(ends[pick % len(ends)])
    return 1 + pick % (sum(sizes) + 64)


@exercise("2.2", "DDP's bucket assignment")
@SETTINGS
@given(cfg=MODELS, pick=st.integers(0, 10**6), exact=st.booleans())
def check_make_buckets(impl, cfg, pick, exact):
    sizes = sizes_of(cfg)
    cap = cap_for(sizes, pick, exact)
    expected = ddp_buckets(cfg, cap)[0]
    got = impl.make_buckets(list(sizes), cap)
    got = [list(map(int, b)) for b in got] if isinstance(got, (list, tuple)) else got
    expect_equal(got, expected, what=f"make_buckets({sizes}, cap_bytes={cap})",
                 hint="walk the indices from the last to the first; close a bucket as soon as "
                      "it holds at least cap_bytes (the index that reaches the cap stays in "
                      "it); the leftover indices form the last bucket")


# ---- 2.3 -----------------------------------------------------------------------------
@exercise("2.3", "the backward_post at which each bucket is launched")
@SETTINGS
@given(cfg=MODELS, pick=st.integers(0, 10**6), exact=st.booleans())
def check_launch_after(impl, cfg, pick, exact):
    _, units, order, expected = ddp_buckets(cfg, cap_for(sizes_of(cfg), pick, exact))
    got = impl.launch_after([list(u) for u in units], list(order))
    got = list(got) if isinstance(got, tuple) else got
    expect_equal(got, expected, what=f"launch_after({units}, {order})",
                 hint="a bucket goes out at the backward_post of the last of its units to "
                      "finish (the latest in backward_order), and never before the bucket "
                      "ahead of it")


# ---- 2.4 -----------------------------------------------------------------------------
@exercise("2.4", "gradient accumulation with the right loss scale")
@SETTINGS
@given(world_size=st.integers(1, 3), per_rank=st.integers(1, 6), layers=st.integers(1, 2),
       cap_mb=st.sampled_from([25.0, 0.004, 0.001]), seed=st.integers(0, 2**16))
def check_accumulate(impl, world_size, per_rank, layers, cap_mb, seed):
    cfg = tiny(layers)
    ids, targets = batch(cfg, world_size * per_rank, seed)
    _, expected = one_device(cfg, ids, targets)
    blocks = [split_data_parallel(ids, targets, r, world_size) for r in range(world_size)]
    block_loss = [one_device(cfg, *b)[0] for b in blocks]
    use_engine = world_size > 1

    def program(ctx):
        model = GPT(cfg)
        engine = DistributedDataParallel(model, AdamW, bucket_cap_mb=cap_mb) \
            if use_engine else None
        x, y = blocks[ctx.rank]  # [s, per_rank]
        sizes = cuts(per_rank, seed + 7 * ctx.rank)  # rank-dependent, unequal sizes
        edges = np.cumsum([0] + sizes)
        micro = [(x[:, a:b].copy(), y[:, a:b].copy()) for a, b in zip(edges, edges[1:])]
        before = len(ctx.trace.of("comm", "all_reduce"))
        call = (f"accumulate(model, micro-batches of {sizes} sequences"
                + (", engine=DistributedDataParallel(...))" if use_engine else ")"))
        if use_engine:
            loss = impl.accumulate(model, micro, engine)
        else:
            loss = impl.accumulate(model, micro)
        grads = engine.full_grads() if use_engine else \
            {p.name: p.grad for p in model.parameters()}
        for name, g in expected.items():
            expect_close(grads[name], g, rank=ctx.rank, what=f"{name}.grad after {call}",
                         hint="scale each micro-batch's loss by its share n_i/n of the "
                              "sequences (1/k only when they are equal): the sum of the "
                              "micro-batch gradients must be the whole batch's gradient")
        expect_close(loss, block_loss[ctx.rank], rank=ctx.rank, what=f"the loss {call} returned",
                     hint="return the mean loss of all the rank's sequences: Σ_i (n_i/n) L_i")
        if use_engine:
            calls = len(ctx.trace.of("comm", "all_reduce")) - before
            expect_equal(calls, len(engine.buckets), rank=ctx.rank,
                         what=f"all-reduces issued by {call} with {len(engine.buckets)} "
                              f"bucket(s)",
                         hint="run every micro-batch but the last inside engine.no_sync(), "
                              "and the last one outside it")

    on_ranks(program, world_size)

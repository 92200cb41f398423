"""What `minipar train` shows while it runs and when it ends."""

from __future__ import annotations

import math
import shutil
import time

from ..runtime.ledger import fmt_bytes


PEAK_KINDS = {"float32": "TF32 tensor-core", "bfloat16": "dense BF16 tensor-core",
              "float16": "dense FP16 tensor-core", "float64": "FP64 tensor-core"}


def peak_label(peak_flops: dict, dtype: str) -> str:
    """Which peak MFU divides by: '494 TFLOP/s, the TF32 tensor-core peak (...)'. A float32
    matmul on an H100 counts at TF32's rate (10-bit mantissa inputs, as torch's
    allow_tf32 gives); the plain FP32 rate, `fp32_simt`, is several times lower."""
    peak = peak_flops[dtype]
    label = f"{peak / 1e12:g} TFLOP/s, the {PEAK_KINDS.get(dtype, dtype)} peak"
    if dtype == "float32" and "fp32_simt" in peak_flops:
        label += (f" (float32 matmuls counted as TF32; plain FP32 is "
                  f"{peak_flops['fp32_simt'] / 1e12:g} TFLOP/s)")
    return label


class Progress:
    """A one-line bar redrawn in place on a terminal; plain log lines every `every` steps
    otherwise (CI logs stay readable). Both on `stream` (stderr)."""

    def __init__(self, stream, every: int, width: int = 24):
        self.stream, self.every, self.width = stream, every, width
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last_draw = 0.0

    def __call__(self, info) -> None:
        loss = f"loss {info.loss:.4f}" + (" (skipped: fp16 overflow)" if info.skipped else "")
        text = (f"step {info.step:>{len(str(info.steps))}}/{info.steps}  {loss}  "
                f"lr {info.lr:.2e}  {info.tokens_per_second:,.0f} tok/s")
        if self.tty:
            now = time.monotonic()
            if info.step < info.steps and now - self._last_draw < 0.1:
                return  # redraw at most ten times a second
            self._last_draw = now
            done = round(self.width * info.step / info.steps)
            bar = "#" * done + "." * (self.width - done)
            line = f"[{bar}] {text}"[:shutil.get_terminal_size().columns - 1]  # never wrap
            self.stream.write(f"\r{line}\033[K")
            if info.step == info.steps:
                self.stream.write("\n")
        elif info.step % self.every == 0 or info.step in (1, info.steps) or info.skipped:
            self.stream.write(text + "\n")
        self.stream.flush()


def summary(cfg, r) -> list[str]:
    """What `minipar train` prints at the end: loss, simulated time, FLOPs, MFU, memory."""
    n = min(5, cfg.steps)
    m = r.model.cfg
    flops = f"{r.model_flops_per_step:,.0f} a step: 72 B s l h^2 (1 + s/6h + V/12lh)" + (
        ", the MLPs of the MoE blocks as the k experts a token runs and the router"
        if m.moe is not None else "")
    if math.isclose(r.clock_flops_per_step, r.model_flops_per_step, rel_tol=1e-9):
        flops += ", exactly what the clock was charged"
    else:
        flops += f"; the clock was charged {r.clock_flops_per_step:,.0f}"
    memory = ", ".join(f"{c} {fmt_bytes(b)}" for c, b in r.ledger_peak.items() if c != "total")
    devices = r.world_size
    where = (f"one simulated {r.device_name}" if not cfg.parallel else
             f"{devices} simulated {r.device_name} device{'s' if devices > 1 else ''}"
             + (f", a pipeline of {cfg.pp * cfg.chunks} stages" if cfg.pipelined else ""))
    padded = (f" (padded to {m.vocab_size})" if m.vocab_size != r.tokenizer.vocab_size
              else "")
    lines = [
        f"minipar train: GPT, {m.num_layers} layers, hidden {m.hidden}, {m.num_heads} heads, "
        f"{r.tokenizer.vocab_size}-character vocabulary{padded}: {r.num_parameters:,} parameters in {cfg.dtype} "
        f"on {where}",
        f"  batches         {cfg.steps} steps of {cfg.global_batch} sequences x {cfg.seq_len} "
        f"characters ({cfg.tokens_per_step:,} tokens), {cfg.num_microbatches} micro-batch"
        f"{'es' if cfg.num_microbatches > 1 else ''} each",
    ]
    if m.moe is not None:
        e = m.moe
        cap = ("dropless" if e.capacity_factor is None
               else f"capacity factor {e.capacity_factor:g}")
        lines.append(
            f"  experts         {e.num_experts} in each of blocks "
            f"{[i for i in range(m.num_layers) if e.is_moe_block(i)]}, top {e.top_k}, {cap}, "
            f"over ep {cfg.ep}: {m.num_active_parameters():,} of the "
            f"{m.num_parameters():,} parameters active per token; aux loss "
            f"{e.aux_loss_coeff:g}{' (global batch)' if e.global_aux_loss else ''}, z-loss {e.z_loss_coeff:g}, bias rate {e.bias_update_rate:g}")
    if cfg.parallel:
        lines += [f"  layout          {layout(cfg)}", f"  cluster         {r.topology}"]
    if cfg.pipelined:
        lines.append(
            f"  pipeline        {cfg.schedule}, pp {cfg.pp}, {cfg.chunks} chunk"
            f"{'s' if cfg.chunks > 1 else ''} per rank: with equal stages a rank idles "
            f"{100 * r.bubble:.1f} % of a step (the bubble: idle / total; "
            f"{100 * r.bubble_over_ideal:.1f} % as idle / ideal, the papers' bubble fraction)")
    lines += [
        f"  optimizer       AdamW, lr {cfg.lr:g}, {cfg.warmup_steps} warmup steps, cosine to "
        f"{cfg.min_lr:g}, weight decay {cfg.weight_decay:g}, clip {cfg.clip:g}",
        f"  loss            {r.first_loss(n):.4f} (mean of the first {n} steps) -> "
        f"{r.last_loss(n):.4f} (mean of the last {n})",
    ]
    if cfg.dtype == "float16":
        lines.append(f"  skipped steps   {r.skipped_steps} of {cfg.steps} (float16 gradients "
                     f"overflowed); loss scale now {r.final_loss_scale:g}")
    peak_model = cfg.compute_model == "peak"
    kernels = "" if peak_model else "the GEMMs' efficiency, the elementwise work, "
    bound = (f"the bubble alone bounds it at {100 * (1 - r.bubble):.1f} %; {kernels}messages "
             f"(each send's and collective's latency: the stages' activations and gradients, "
             f"the norm's all-reduce, the loss's broadcast) and unequal stages take the rest"
             if cfg.pipelined else f"{kernels}the exposed communication and the idle time "
             f"below take the rest")
    one = (": on one device by construction (every matmul at peak, nothing else on the "
           "clock)" if peak_model else ": the GEMMs run at their efficiency, and the "
           "elementwise work takes the time its bytes need")
    lines += [
        f"  compute model   {cfg.compute_model}: {r.compute}"
        + ("" if peak_model else " (--compute-model peak: every matmul at peak)"),
        f"  simulated time  {r.sim_step_time * 1e6:.3f} us a step on the device clock"
        + (" (the slowest rank's)" if devices > 1 else "" if peak_model else
           f": matmuls {(r.sim_step_times[-1] - r.elementwise_time) * 1e6:.3f} us, "
           f"elementwise work {r.elementwise_time * 1e6:.3f} us"),
        f"  model FLOPs     {flops}",
        f"  simulated MFU   {100 * r.mfu:.{1 if r.mfu >= 0.01 else 3}f} % of {r.peak_label}" + (
            one if devices == 1 else f" on each of {devices} devices: {bound}"),
        f"  memory peak     {memory}; total {fmt_bytes(r.ledger_peak['total'])}"
        + ("" if devices == 1 else " (the busiest rank's)"),
        f"  wall time       {r.wall_time:.1f} s "
        f"({cfg.steps * cfg.tokens_per_step / r.wall_time:,.0f} tokens/s on this machine)",
    ]
    if devices > 1:
        lines += time_table(r) + memory_table(r)
    return lines


def layout(cfg) -> str:
    """'dp 2 (ZeRO-1) x pp 2 x tp 2 + SP = 8 ranks, laid out in the order tp-cp-ep-dp-pp
    (Megatron's, fastest first)'."""
    hybrid = (f" sharded over {cfg.dp // cfg.dp_replicate}, replicated {cfg.dp_replicate}"
              f" times" if cfg.dp_replicate > 1 else "")
    dp = f"dp {cfg.dp}" + (f" (ZeRO-{cfg.zero}{hybrid})" if cfg.zero else
                           " (DDP)" if cfg.dp > 1 else "")
    tp = f"tp {cfg.tp}" + (" + SP" if cfg.sequence_parallel else "")
    cp = f" x cp {cfg.cp} ({cfg.cp_method}, zigzag rows)" if cfg.cp > 1 else ""
    return (f"{dp}{cp} x pp {cfg.pp} x {tp} = {cfg.world_size} ranks, laid out in the order "
            f"{cfg.order} (Megatron's, fastest first)")


def rank_label(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2,5'; [3] -> 'rank 3'."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def _grouped(rows: list[list[str]]) -> list[tuple[str, list[str]]]:
    """Ranks with the same row, once: [(rank_label, row)] in order of their first rank."""
    seen: dict[tuple, list[int]] = {}
    for rank, row in enumerate(rows):
        seen.setdefault(tuple(row), []).append(rank)
    return [(rank_label(ranks), list(row)) for row, ranks in seen.items()]


def _table(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    groups = _grouped(rows)
    first = max(len(label) for label, _ in groups)
    widths = [max(len(h), *(len(row[i]) for _, row in groups)) for i, h in enumerate(header)]
    lines = [f"  {title}", "    " + " " * first + "".join(f"  {h:>{w}}" for h, w in
                                                          zip(header, widths))]
    lines += ["    " + f"{label:<{first}}" + "".join(f"  {v:>{w}}" for v, w in zip(row, widths))
              for label, row in groups]
    return lines


def time_table(r) -> list[str]:
    """The last step's simulated time on each rank: compute, exposed communication per link
    class, idle (train_timing.split_step), in us; each row sums to the step."""
    keys = list(r.time_split[0])
    links = [k for k in keys if k not in ("compute", "idle")]
    header = ["compute", *(f"exposed {k}" for k in links), "idle", "step"]
    rows = [[f"{s[k] * 1e6:.3f}" for k in ["compute", *links, "idle"]]
            + [f"{sum(s.values()) * 1e6:.3f}"] for s in r.time_split]
    return _table("time split      the last step on each rank, simulated us (idle: nothing "
                  "to compute, nothing of its own on the wire: bubble and waits)", header, rows)


def memory_table(r) -> list[str]:
    """Each rank's ledger peak by category (the peak of each category on its own; total: the
    peak of their sum)."""
    used = [c for c in r.ledger_peak if c != "total"]
    rows = [[fmt_bytes(p.get(c, 0)) for c in used] + [fmt_bytes(p["total"])]
            for p in r.rank_peaks]
    return _table("memory peaks    on each rank, by the ledger's category", [*used, "total"],
                  rows)

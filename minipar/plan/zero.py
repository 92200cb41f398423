"""Model-state memory and communication of ZeRO data parallelism (Rajbhandari et al. 2020,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", section 5, Figure 1).

Mixed-precision Adam keeps, per parameter, 2 bytes of 16-bit weights, 2 bytes of 16-bit
gradients and K = 12 bytes of optimizer state (float32 master weights, m and v, 4 bytes
each). With Ψ parameters and N data-parallel ranks, one rank holds:

    stage  name                  parameters  gradients  optimizer states  total
    0      DDP                   2Ψ          2Ψ         KΨ                (2 + 2 + K)Ψ = 16Ψ
    1      ZeRO-1 (P_os)         2Ψ          2Ψ         KΨ/N              4Ψ + KΨ/N
    2      ZeRO-2 (P_os+g)       2Ψ          2Ψ/N       KΨ/N              2Ψ + (2 + K)Ψ/N
    3      ZeRO-3 (P_os+g+p)     2Ψ/N        2Ψ/N       KΨ/N              (2 + 2 + K)Ψ/N

Padding: stages >= 1 keep each state in a flat buffer of Ψ' = Ψ + padding elements, the
padding (zeros at the end of each unit's buffer) making it divisible by N; every rank's
shard holds Ψ'/N elements. The padding is real memory wherever the buffer or a shard of it
is held, so at stages >= 1 every term uses Ψ' in place of Ψ: a replicated term holds Ψ'
elements, a sharded one Ψ'/N (the layout of minipar.parallel.flat). DDP needs no equal
blocks for its all-reduce and pads nothing: padding does not enter stage 0.
`flat_padding(psi, dp)` gives the least padding of a single buffer, (-Ψ) mod N. (For a
buffer of a few elements padding can outweigh sharding: Ψ = 1, N = 2 holds 16 bytes under
DDP and 20 under ZeRO-1.)

Communication per step, elements each rank sends (ring algorithms, section 7):
    DDP       all-reduce of the gradients                 2Ψ(N-1)/N
    ZeRO-1/2  reduce-scatter gradients + all-gather
              the updated parameters                      Ψ(N-1)/N + Ψ(N-1)/N = 2Ψ(N-1)/N
    ZeRO-3    all-gather parameters in forward, again
              in backward, reduce-scatter gradients       3Ψ(N-1)/N   (1.5x DDP)
Stages >= 1 run these collectives on the padded flat buffer, so Ψ' replaces Ψ there too.

Only model states are counted here: activations (see memory.py), temporary and
communication buffers, and allocator fragmentation come on top. Sizes in bytes; "GB" is
10^9 bytes, as in the paper (the ledger's fmt_bytes prints binary GiB).
"""

from __future__ import annotations

from typing import Sequence, Union

from ..runtime.ledger import fmt_bytes

GB = 10**9

STAGE_NAMES = {0: "DDP", 1: "ZeRO-1 (P_os)", 2: "ZeRO-2 (P_os+g)", 3: "ZeRO-3 (P_os+g+p)"}
STAGE_FORMULAS = {0: "(2 + 2 + K)Ψ", 1: "2Ψ + 2Ψ + KΨ/N", 2: "2Ψ + (2 + K)Ψ/N",
                  3: "(2 + 2 + K)Ψ/N"}


def _check(psi: float, stage: int, dp: int, padding: int) -> None:
    if stage not in STAGE_NAMES:
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3 (ZeRO-1/2/3), got {stage!r}")
    if not (isinstance(dp, int) and dp >= 1):
        raise ValueError(f"dp (the number of data-parallel ranks N) must be an int >= 1, "
                         f"got {dp!r}")
    if psi < 0:
        raise ValueError(f"psi (the number of parameters) cannot be negative, got {psi}")
    if not (isinstance(padding, int) and padding >= 0):
        raise ValueError(f"padding must be a whole number of elements >= 0, got {padding!r}")
    if padding and (psi + padding) % dp:
        raise ValueError(
            f"padding {padding} leaves a flat buffer of {psi} + {padding} elements, which "
            f"does not split evenly over dp = {dp} ranks; use padding = flat_padding(psi, dp)"
            f" = {flat_padding(psi, dp)} (or that plus a multiple of {dp})")


def flat_padding(psi: int, dp: int) -> int:
    """(-Ψ) mod N: the fewest elements that make a flat buffer of Ψ split evenly over N ranks."""
    if not (isinstance(dp, int) and dp >= 1):
        raise ValueError(f"dp must be an int >= 1, got {dp!r}")
    return int(-psi % dp)


def model_state_bytes(psi: float, stage: int, dp: int, k: float = 12, param_bytes: float = 2,
                      grad_bytes: float = 2, padding: int = 0) -> dict[str, float]:
    """Bytes of model states one rank holds at a ZeRO stage (table in the module docstring).

    psi: parameters Ψ; stage: 0 (DDP) .. 3 (ZeRO-3); dp: data-parallel ranks N;
    k: optimizer bytes per parameter (12 for mixed-precision Adam); padding: elements
    added to the flat buffer so it splits evenly (at stages >= 1, Ψ + padding replaces Ψ
    in every term; stage 0 pads nothing).
    Returns {"parameters", "gradients", "optimizer_states", "total"}, the ledger's
    category names.
    """
    _check(psi, stage, dp, padding)
    full = psi if stage == 0 else psi + padding       # Ψ', elements of the flat buffer
    shard = full / dp                                 # elements of one rank's shard
    params = param_bytes * (shard if stage >= 3 else full)
    grads = grad_bytes * (shard if stage >= 2 else full)
    optim = k * (shard if stage >= 1 else full)
    return {"parameters": float(params), "gradients": float(grads),
            "optimizer_states": float(optim), "total": float(params + grads + optim)}


def dp_comm_elements(psi: float, stage: int, dp: int, padding: int = 0) -> float:
    """Elements one rank sends per step: 2Ψ(N-1)/N for DDP and ZeRO-1/2, 3Ψ(N-1)/N for ZeRO-3.

    Stages >= 1 communicate the padded flat buffer, Ψ' = Ψ + padding elements.
    Multiply by the gradient/parameter element size for bytes.
    """
    _check(psi, stage, dp, padding)
    n = psi if stage == 0 else psi + padding
    passes = 3 if stage == 3 else 2  # ZeRO-3 gathers the parameters twice
    return passes * n * (dp - 1) / dp


def zero_figure1() -> list[dict]:
    """The paper's Figure 1: Ψ = 7.5B, N = 64, K = 12 -> 120, 31.4, 16.6, 1.9 GB per device.

    Each row: stage, name, formula, bytes, gb (exact, 10^9 bytes) and label, the value as
    the paper prints it (one decimal, a trailing .0 dropped): 120GB, 31.4GB, 16.6GB, 1.9GB.
    The exact values are 120, 31.40625, 16.640625 and 1.875 GB.
    """
    psi, dp = 7.5e9, 64
    rows = []
    for stage in STAGE_NAMES:
        total = model_state_bytes(psi, stage, dp)["total"]
        label = f"{total / GB:.1f}".removesuffix(".0") + "GB"
        rows.append({"stage": stage, "name": STAGE_NAMES[stage],
                     "formula": STAGE_FORMULAS[stage], "bytes": total, "gb": total / GB,
                     "label": label})
    return rows


def memory_report(params_billion: Union[float, Sequence[float]] = (7, 70, 405),
                  dp: Union[int, Sequence[int]] = (8, 64, 1024),
                  stages: Sequence[int] = (0, 1, 2, 3), capacity_gb: float = 80,
                  k: float = 12, param_bytes: float = 2, grad_bytes: float = 2
                  ) -> list[dict]:
    """One row per (model size, N, stage): the model-state bytes per rank and whether they fit.

    Each row: params_billion, psi, dp, stage, name, parameters, gradients,
    optimizer_states, total (bytes), gb (10^9 bytes), binary (the ledger's GiB string),
    capacity_gb and fits (total <= capacity_gb GB). Fitting is necessary, not sufficient:
    activations and buffers need room too. Print the rows with `format_memory_report`.
    """
    sizes = [params_billion] if isinstance(params_billion, (int, float)) else params_billion
    dps = [dp] if isinstance(dp, int) else dp
    rows = []
    for b in sizes:
        psi = b * 1e9
        for n in dps:
            for stage in stages:
                m = model_state_bytes(psi, stage, n, k=k, param_bytes=param_bytes,
                                      grad_bytes=grad_bytes)
                rows.append({"params_billion": b, "psi": psi, "dp": n, "stage": stage,
                             "name": STAGE_NAMES[stage], **m, "gb": m["total"] / GB,
                             "binary": fmt_bytes(m["total"]), "capacity_gb": capacity_gb,
                             "fits": m["total"] <= capacity_gb * GB})
    return rows


def format_memory_report(rows: list[dict]) -> str:
    """A table of `memory_report` rows: one line per (model, N), one column per stage.

    A value marked * does not fit in the rows' capacity_gb.
    """
    capacity_gb = rows[0]["capacity_gb"] if rows else 80
    stages = sorted({r["stage"] for r in rows})
    head = f"{'params':>8}{'N':>6}" + "".join(f"{STAGE_NAMES[s].split()[0]:>12}"
                                               for s in stages)
    lines = [f"model states per device in GB (10^9 bytes); * = over {capacity_gb:g} GB",
             head]
    cells: dict[tuple, dict[int, str]] = {}
    for r in rows:
        mark = " " if r["fits"] else "*"
        cells.setdefault((r["params_billion"], r["dp"]), {})[r["stage"]] = f"{r['gb']:.2f}{mark}"
    for (b, n), by_stage in cells.items():
        lines.append(f"{b:>7g}B{n:>6}" + "".join(f"{by_stage.get(s, '-'):>12}"
                                                  for s in stages))
    return "\n".join(lines)

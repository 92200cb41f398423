"""A lesson's figures from what minipar measured: bars, lines and per-rank timelines.

A lesson hands data to one of these calls and gets a picture where a picture can be shown:

    figures.bars("03_zero_memory", "Bytes per rank by ZeRO stage", ["DDP", "ZeRO-1", ...],
                 {"weights": [...], "gradients": [...], "optimizer": [...]},
                 ylabel="GB per rank", stacked=True, hline=(80, "an H100's 80 GB"))
    figures.lines("05_bubble", "Bubble against micro-batches", [1, 2, 4, 8],
                  {"GPipe": [...], "1F1B": [...]}, xlabel="micro-batches m",
                  ylabel="bubble fraction")
    figures.timeline("06_zb_h1", "ZB-H1 on the clock", dry_run(...))
    figures.timeline("02_step", "One DDP step", mp.launch(...), start=t0)  # a plain run
    figures.timelines("06_schedules", "Four schedules on one clock",
                      {"1F1B": dry_run(...), "ZB-H1": dry_run(...)})

Where the picture goes:

- in a notebook (an IPython kernel), inline, as a PNG in the cell's output;
- run as a script (`python lessons/03_zero_fsdp/lesson.py`), into a PNG file in the
  `figures/` directory beside the script, or in $MINIPAR_FIGURES when it is set; the
  lesson prints where (`[figure: lessons/03_zero_fsdp/figures/03_zero_memory.png]`);
- without matplotlib (it comes with the `plots` extra: `pip install -e ".[plots]"`), nowhere:
  one line says what was not drawn, and the lesson goes on in text, whose printed numbers
  are what the figure would show;
- with MINIPAR_FIGURES=none, nowhere and silently: the lesson runs as text, faster (the
  tests that rerun a lesson in their own process to read its variables set it).

The data are checked first, with or without matplotlib: a name that cannot be a file
name, or a series whose length is not the number of categories (or x values), raises
ValueError saying what was expected and what was received.

The figures are matplotlib's object API on the Agg canvas (no pyplot, no global state, no
display needed) and each call returns the path it wrote, or None.
"""

from __future__ import annotations

import base64
import io
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..runtime.trace import Event
from .pipeline import boxes

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
# one colour per series, and per pipeline action (F forward, B backward, I input grad, W
# weight grad, & an overlapped pair), colour-blind safe (Okabe and Ito)
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#000000"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
DASHES = ["-", "--", "-.", ":"]
ACTION_COLOURS = {"F": "#56B4E9", "B": "#009E73", "I": "#E69F00", "W": "#CC79A7",
                  "&": "#0072B2"}
ACTION_NAMES = {"F": "forward", "B": "backward", "I": "backward (input)",
                "W": "backward (weights)", "&": "overlapped F&B"}
STREAM_COLOURS = {"compute": "#0072B2", "comm": "#E69F00"}
DPI = 100


def available() -> bool:
    """Whether figures are drawn: matplotlib can be imported (the `plots` extra) and
    $MINIPAR_FIGURES is not "none"."""
    if os.environ.get("MINIPAR_FIGURES") == "none":
        return False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _shell():
    """The IPython shell this runs in, when it is a kernel's (a notebook); else None."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell if shell is not None and hasattr(shell, "kernel") else None


def _in_kernel() -> bool:
    """Whether this runs in an IPython kernel (a notebook), where a figure shows inline."""
    return _shell() is not None


def directory() -> Optional[Path]:
    """Where a figure's PNG goes: $MINIPAR_FIGURES when set; else None in a notebook (the
    figure is shown inline, not saved); else figures/ beside the running script, or in the
    working directory when there is no script (`python -c`, an interactive session)."""
    env = os.environ.get("MINIPAR_FIGURES")
    if env:
        return Path(env)
    if _in_kernel():
        return None
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return (Path(main).resolve().parent if main else Path.cwd()) / "figures"


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"a figure's name becomes its file name: expected letters, digits, "
                         f"'_', '-' and '.', starting with a letter or digit; received {name!r}")


def _check(name: str, n: int, series: Mapping[str, Sequence[float]], what: str) -> None:
    _check_name(name)
    if not isinstance(series, Mapping) or not series:
        raise ValueError(f"figure {name!r}: expected at least one series, a mapping "
                         f"{{label: values}}; received {series!r}")
    for label, values in series.items():
        if len(values) != n:
            raise ValueError(f"figure {name!r}: series {label!r} has {len(values)} values, "
                             f"expected {n}, one per {what}")


def _new(title: str, width: float = 7.0, height: float = 3.6, rows: int = 1,
         sharex: bool = False):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # a title wider than the figure widens it (to 11 inches), then wraps, at about 0.09
    # inch a character of 11 points
    width = max(width, min(11.0, 0.09 * len(title) + 0.4))
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=sharex, squeeze=False)[:, 0]
    for ax in axes:
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(textwrap.fill(title, int((width - 0.4) / 0.09)), fontsize=11)
    return fig, list(axes)


def _finish(name: str, title: str, fig) -> Optional[Path]:
    """Show the figure inline in a notebook, or write it as a PNG; say where."""
    engine = fig.get_layout_engine()
    if engine is not None:  # lay out once, measuring the text; savefig then draws once
        engine.execute(fig)
        fig.set_layout_engine("none")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    png = buf.getvalue()
    target = directory()
    path = None
    if target is not None:
        target.mkdir(parents=True, exist_ok=True)
        path = target / f"{name}.png"
        path.write_bytes(png)
        try:
            shown = path.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            shown = path
        print(f"[figure: {shown}]")
    shell = _shell()
    if shell is not None:  # a display_data output, as IPython.display.Image would make
        shell.display_pub.publish(
            data={"image/png": base64.b64encode(png).decode("ascii"),
                  "text/plain": f"<figure {name}: {title}>"},
            metadata={"image/png": {"width": int(fig.get_figwidth() * DPI),
                                    "height": int(fig.get_figheight() * DPI)}})
    return path


def _missing(title: str) -> None:
    if os.environ.get("MINIPAR_FIGURES") == "none":  # asked for no figures: say nothing
        return None
    print(f"[figure not drawn: {title!r} needs matplotlib (pip install -e \".[plots]\"); "
          f"the numbers printed above are what it shows]")


def _hline(ax, hline: Optional[tuple[float, str]]) -> list:
    """A limit drawn across, named in the legend (a label on the plot would collide with
    what is drawn there); its legend handle, if any."""
    if hline is None:
        return []
    return [ax.axhline(float(hline[0]), color="#555555", linestyle="--", linewidth=1,
                       label=str(hline[1]))]


def bars(name: str, title: str, categories: Sequence[str],
         series: Mapping[str, Sequence[float]], *, ylabel: str, xlabel: str = "",
         stacked: bool = False, logy: bool = False,
         hline: Optional[tuple[float, str]] = None,
         annotate: Optional[str] = None) -> Optional[Path]:
    """One group of bars per category, one bar per series (or one stacked bar).
    `hline` = (y, label) draws a limit across; `annotate` is a format ("{:.1f}") for the
    value written over each bar (over each stack's top when stacked)."""
    _check(name, len(categories), series, "category")
    if not available():
        return _missing(title)
    longest = max((len(str(c)) for c in categories), default=0)
    per = (1.25 if longest > 12 else 0.9) * (1.0 if stacked else max(1.0, len(series) / 2))
    fig_width = max(5.0, min(11.0, per * len(categories) + 3))
    fig, (ax,) = _new(title, width=fig_width)
    k = len(series)
    width = 0.8 if stacked else 0.8 / k
    xs_all = list(range(len(categories)))
    bottom = [0.0] * len(categories)
    for i, (label, values) in enumerate(series.items()):
        values = [float(v) for v in values]
        if stacked:
            drawn = ax.bar(xs_all, values, width, bottom=bottom, label=label,
                           color=PALETTE[i % 8])
            bottom = [b + v for b, v in zip(bottom, values)]
        else:
            xs = [j - 0.4 + width * (i + 0.5) for j in xs_all]
            drawn = ax.bar(xs, values, width, label=label, color=PALETTE[i % 8])
            if annotate:
                ax.bar_label(drawn, [annotate.format(v) for v in values], fontsize=7,
                             padding=1)
    if stacked and annotate:
        for x, top in zip(xs_all, bottom):
            ax.annotate(annotate.format(top), (x, top), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7)
    # characters a line under each group: the axes' width (less the legend's and the y
    # label's) over the groups, at about 0.08 inch a character of 9 points
    fig_width = fig.get_figwidth()
    legend = k > 1 or hline is not None
    wrap = max(6, int((fig_width - (3.2 if legend else 1.0)) / len(categories) / 0.08))
    ax.set_xticks(xs_all, [textwrap.fill(str(c), wrap, break_long_words=False,
                                               break_on_hyphens=False) for c in categories],
                  fontsize=9 if longest > 8 else 10)
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    handles = ax.get_legend_handles_labels()[0] if k > 1 else []
    handles = handles[::-1] if stacked else handles  # listed top to bottom, as stacked
    handles += _hline(ax, hline)
    if logy:
        ax.set_yscale("log")
    elif annotate:
        ax.margins(y=0.12)
    if legend:
        fig.legend(handles=handles, frameon=False, fontsize=8, loc="outside right center")
    return _finish(name, title, fig)


def lines(name: str, title: str, x: Sequence[float], series: Mapping[str, Sequence[float]],
          *, xlabel: str, ylabel: str, logx: bool = False, logy: bool = False,
          hline: Optional[tuple[float, str]] = None) -> Optional[Path]:
    """One line per series over the same x; `hline` = (y, label) draws a limit across.
    Each series has its own colour, marker and dash, so lines that coincide stay visible."""
    _check(name, len(x), series, "x value")
    if not available():
        return _missing(title)
    fig, (ax,) = _new(title)
    many = len(x) > 30
    for i, (label, values) in enumerate(series.items()):
        ax.plot([float(v) for v in x], [float(v) for v in values],
                marker=None if many else MARKERS[i % 8], markersize=4 + 2 * (i == 0),
                linestyle=DASHES[i % 4], label=label, color=PALETTE[i % 8])
    _hline(ax, hline)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log", base=2)
        labels = [f"{v:,g}" if float(v) < 1e6 else f"{v:.3g}" for v in x]
        if len(x) <= 12 and max(len(t) for t in labels) <= 7:  # the values, not powers of 2
            ax.set_xticks([float(v) for v in x], labels, minor=False)
            ax.minorticks_off()
    if logy:
        ax.set_yscale("log")
    if len(series) > 1 or hline is not None:
        ax.legend(frameon=False, fontsize=8)
    return _finish(name, title, fig)


def _events_of(name: str, source) -> list[Event]:
    contexts = getattr(source, "contexts", None)
    events = [e for c in contexts for e in c.trace.events] if contexts is not None \
        else list(source)
    if not events:
        raise ValueError(f"figure {name!r}: expected a DryRun, a LaunchResult or trace "
                         f"events; received a source with no events to draw")
    return events


def _unit(span: float, clocked: bool) -> tuple[float, str]:
    """A time axis's scale and label: a dry run's own units, or seconds made readable."""
    if not clocked:
        return 1.0, "time (the dry run's duration units)"
    for scale, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "µs")):
        if span * scale >= 1:
            return scale, f"simulated time ({unit})"
    return 1e9, "simulated time (ns)"


def _draw_rows(ax, name: str, source, start: float, end: Optional[float],
               world_size: Optional[int], legend: bool) -> tuple[int, str, list]:
    """One source's rows on `ax`; (ranks, the x label, the legend's handles)."""
    from matplotlib.patches import Patch

    drawn = boxes(source)
    clocked = not hasattr(source, "makespan")
    if drawn:
        rows = [(b.rank, float(b.start), float(b.end), b) for b in drawn]
    else:
        rows = [(e.rank, float(e.start), float(e.end), e) for e in _events_of(name, source)]
    rows = [r for r in rows if r[2] > start and (end is None or r[1] < end)]
    if not rows:
        raise ValueError(f"figure {name!r}: no event between {start} and {end}")
    last = float(end) if end is not None else max(r[2] for r in rows)
    span = max(last - start, 1e-30)
    scale, xlabel = _unit(span, clocked)
    ranks = world_size or 1 + max(r[0] for r in rows)
    clip = lambda a, b: ((max(a, start) - start) * scale, (min(b, last) - max(a, start)) * scale)
    if drawn:
        groups: dict[tuple, list] = {}
        for rank, a, b, box in rows:
            groups.setdefault((rank, box.letter.upper(), box.letter.isupper() or
                               box.letter == "&"), []).append(clip(a, b))
            text = f"{box.letter}{box.microbatch}"
            if (min(b, last) - max(a, start)) / span > 0.0075 * len(text) + 0.007:  # it fits
                ax.text((max(a, start) + min(b, last)) / 2 * scale - start * scale, rank,
                        text, ha="center", va="center", fontsize=6,
                        color="white" if box.letter == "&" else "black",
                        in_layout=False)  # inside the axes: the layout need not measure it
        for (rank, letter, first), ranges in groups.items():
            ax.broken_barh(ranges, (rank - 0.4, 0.8),
                           facecolors=ACTION_COLOURS.get(letter, "#999999"),
                           edgecolors="white", linewidth=0.4, alpha=1.0 if first else 0.55)
        used = sorted({b.letter.upper() for *_, b in rows}, key="FBIW&".index)
        handles = [Patch(color=ACTION_COLOURS[u], label=ACTION_NAMES[u]) for u in used]
        if any(not (b.letter.isupper() or b.letter == "&") for *_, b in rows):
            handles.append(Patch(color="#999999", alpha=0.55,
                                 label="paler: a rank's later stage"))
    else:
        groups = {}
        for rank, a, b, e in rows:
            kind = "compute" if e.stream == "compute" else "comm"
            groups.setdefault((rank, kind), []).append(clip(a, b))
        for (rank, kind), ranges in groups.items():
            lane = -0.2 if kind == "compute" else 0.2
            ax.broken_barh(ranges, (rank + lane - 0.18, 0.36), facecolors=STREAM_COLOURS[kind],
                           edgecolors="white" if kind == "comm" else "none", linewidth=0.6)
        handles = [Patch(color=STREAM_COLOURS["compute"], label="compute"),
                   Patch(color=STREAM_COLOURS["comm"], label="communication")]
    if legend:
        ax.figure.legend(handles=handles, frameon=False, fontsize=8,
                         loc="outside right center")
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.set_ylim(ranks - 0.5, -0.5)
    ax.set_xlim(0, span * scale)
    return ranks, xlabel, handles


def timeline(name: str, title: str, source, *, world_size: Optional[int] = None,
             start: float = 0.0, end: Optional[float] = None) -> Optional[Path]:
    """Each rank's row on the clock. A pipeline (a DryRun, or a run whose trace holds the
    runner's F/B/I/W actions) is drawn action by action, labelled with its micro-batch;
    any other run stream by stream: compute, and communication (every other stream).
    `start` and `end` cut a window out of the clock (the time axis starts at `start`)."""
    _check_name(name)
    boxes(source) or _events_of(name, source)  # the source's errors, with or without matplotlib
    if not available():
        return _missing(title)
    fig, (ax,) = _new(title, width=9.0)
    ranks, xlabel, _ = _draw_rows(ax, name, source, start, end, world_size, legend=True)
    fig.set_figheight(1.0 + 0.42 * ranks)
    ax.set_xlabel(xlabel)
    return _finish(name, title, fig)


def timelines(name: str, title: str, sources: Mapping[str, object], *,
              starts: Optional[Mapping[str, float]] = None,
              length: Optional[float] = None) -> Optional[Path]:
    """Several timelines (DryRuns, runs or events) one above the other on one clock: the
    same x axis, so that their lengths compare; each panel titled by its label. `starts`
    gives a source's own time zero (a run's step after its set-up), by label; `length`
    how much of the clock to draw from there (by default as long as the longest)."""
    _check_name(name)
    if not isinstance(sources, Mapping) or not sources:
        raise ValueError(f"figure {name!r}: expected at least one source, a mapping "
                         f"{{label: DryRun or run}}; received {sources!r}")
    for source in sources.values():
        boxes(source) or _events_of(name, source)
    if not available():
        return _missing(title)
    starts = {label: float((starts or {}).get(label, 0.0)) for label in sources}
    if length is None:  # one clock for all: as long as the longest
        length = max(max([float(b.end) for b in boxes(source)]
                      or [float(e.end) for e in _events_of(name, source)]) - starts[label]
                  for label, source in sources.items())
    fig, axes = _new(title, width=9.0, rows=len(sources), sharex=True)
    heights, legend = [], {}
    for ax, (label, source) in zip(axes, sources.items()):
        ranks, xlabel, handles = _draw_rows(ax, name, source, starts[label],
                                            starts[label] + length, None, legend=False)
        ax.set_title(label, fontsize=9, loc="left")
        heights.append(ranks)
        legend.update({h.get_label(): h for h in handles})
    axes[-1].set_xlabel(xlabel)
    fig.legend(handles=list(legend.values()), frameon=False, fontsize=8,
               loc="outside right center")
    fig.set_figheight(0.8 + sum(0.36 * r + 0.45 for r in heights))
    return _finish(name, title, fig)

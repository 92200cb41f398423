"""Pictures of what the runtime recorded: Chrome traces, terminal timelines and figures.

The viz layer only *reads* trace events (`runtime/trace.py`) and plain data; it never runs
a model and imports nothing model-related, so it draws any program the runtime executed:

    result = minipar.launch(step, world_size=4)
    to_chrome_trace(result, "step.json")          # open in https://ui.perfetto.dev
    print(render_timeline(result.events(), 4))     # one row per rank in the terminal
    print(summarize(result.events(), 4))           # compute / comm / overlap / idle
    print(render_pipeline(dry_run(...)))            # a pipeline schedule: F B I W & per rank
    figures.timeline("step", "One step", result)   # the same as a picture (matplotlib)

`figures` (bars, lines, timeline, timelines) is what the lessons draw their figures with:
inline in a notebook, a PNG under figures/ (or $MINIPAR_FIGURES) run as a script, one line
of text where matplotlib, an optional dependency (the `plots` extra), is missing.
"""

from . import figures
from .chrome import STREAM_TIDS, to_chrome_trace
from .pipeline import action_letter, dry_run_events, render_pipeline
from .timeline import COLLECTIVE_LETTERS, RankTimes, measure, render_timeline, summarize

__all__ = ["to_chrome_trace", "STREAM_TIDS", "render_timeline", "summarize", "measure",
           "RankTimes", "COLLECTIVE_LETTERS", "render_pipeline", "dry_run_events",
           "action_letter", "figures"]

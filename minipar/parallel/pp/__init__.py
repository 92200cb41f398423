"""Pipeline parallelism: schedules as data, their lowering, a validator and a dry run.
Read in this order (docs/pipeline_parallel.md):

    actions.py    Action (stage, kind, micro-batch), written `2F0` as in torch.distributed
                  .pipelining; the kinds F, B, I, W and SEND_F, RECV_F, SEND_B, RECV_B;
                  OverlapFB, an overlapped (F; B) pair, `(0F7;7B3)OVERLAP_F_B`
    schedules.py  schedule(name, pp, microbatches, chunks): GPipe, 1F1B, interleaved 1F1B,
                  own_chunks(name) (2 in a V, else 1),
                  one ordered list of compute actions per pipeline rank, and the registry
    zero_bubble.py  ZB-H1, ZB-H2, ZB-V: the backward split into I and W (docs/zero_bubble.md)
    dualpipe.py   DualPipeV: two chunks a rank in a V, overlapped F&B pairs
    validate.py   the rules any schedule obeys, checked, with the rank and action that break one
    lowering.py   the sends and receives derived from the compute actions, in an order
                  that cannot deadlock under rendezvous sends; the message each one moves;
                  pair_overlap: the messages a pair times per half
    dry_run.py    the lowered lists run on a clock: makespan, idle time, both bubble
                  fractions, the activations each rank holds; deadlocks reported first
    stage.py      PipelineStage: blocks lo..hi of a GPT (the first embeds, the last computes
                  the loss), its backward whole (B) or split (I, then W); split_layers; build_stages; dropout masks at their places;
                  RankStages, a rank's stages as one model for a data-parallel engine
    runner.py     PipelineRunner: one rank's lowered list run with isend/irecv in the pp
                  group, gradients accumulated over the micro-batches, tied embeddings'
                  gradients summed over the embedding group

The first seven are plain data and pure functions (no communication), so plan and viz can
import them by module; stage.py and runner.py run the model, and runner.py alone
communicates.
"""

from .actions import (B, COMMUNICATION, COMPUTE, F, I, OVERLAP_F_B, RECV_B, RECV_F, SEND_B, SEND_F,
                      W, Action, Kind, OverlapFB, ScheduleError, format_schedule, parse_action,
                      parse_schedule, parts, placement)
from .dualpipe import dualpipev
from .dry_run import DryRun, Span, check_deadlock, dry_run, peak_in_flight
from .lowering import Message, lower, message, pair_overlap
from .runner import PipelineRunner, StepTimes
from .schedules import SCHEDULES, gpipe, interleaved_1f1b, one_f_one_b, own_chunks, schedule
from .stage import (DropoutStream, PipelineStage, RankStages, build_stages, dropout_draws,
                    split_layers)
from .validate import ScheduleDeadlockError, ScheduleInfo, validate_schedule
from .zero_bubble import zb_h1, zb_h2, zbv

# F, B, I, W are importable by name (from minipar.parallel.pp import F, B) but left out of
# __all__, so that minipar.parallel's namespace gets no one-letter names; Kind.F spells them.
__all__ = ["Action", "Kind", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OverlapFB", "OVERLAP_F_B",
           "parts", "parse_action", "zb_h1", "zb_h2", "zbv", "dualpipev",
           "COMPUTE", "COMMUNICATION", "ScheduleError", "ScheduleDeadlockError", "parse_schedule",
           "format_schedule", "placement", "schedule", "own_chunks", "SCHEDULES", "gpipe",
           "one_f_one_b",
           "interleaved_1f1b", "validate_schedule", "ScheduleInfo", "lower", "message",
           "pair_overlap",
           "Message", "dry_run", "DryRun", "Span", "check_deadlock", "peak_in_flight",
           "PipelineStage", "RankStages", "split_layers", "build_stages", "dropout_draws",
           "DropoutStream", "PipelineRunner", "StepTimes"]

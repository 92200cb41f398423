"""Pipeline parallelism: schedules as data, their lowering, a validator and a dry run.
Read in this order (docs/pipeline_parallel.md):

    actions.py    Action (stage, kind, micro-batch), written `2F0` as in torch.distributed
                  .pipelining; the kinds F, B, I, W and SEND_F, RECV_F, SEND_B, RECV_B
    schedules.py  schedule(name, pp, microbatches, chunks): GPipe, 1F1B, interleaved 1F1B,
                  one ordered list of compute actions per pipeline rank
    validate.py   the rules any schedule obeys, checked, with the rank and action that break one
    lowering.py   the sends and receives derived from the compute actions, in an order
                  that cannot deadlock under rendezvous sends; the message each one moves
    dry_run.py    the lowered lists run on a clock: makespan, idle time, both bubble
                  fractions, the activations each rank holds; deadlocks reported first

Everything here is plain data and pure functions (no communication), so plan and viz can
import it; the runner that executes a lowered schedule with isend/irecv comes after.
"""

from .actions import (B, COMMUNICATION, COMPUTE, F, I, RECV_B, RECV_F, SEND_B, SEND_F, W, Action,
                      Kind, ScheduleError, format_schedule, parse_schedule, placement)
from .dry_run import DryRun, Span, check_deadlock, dry_run, peak_in_flight
from .lowering import Message, lower, message
from .schedules import SCHEDULES, gpipe, interleaved_1f1b, one_f_one_b, schedule
from .validate import ScheduleDeadlockError, ScheduleInfo, validate_schedule

# F, B, I, W are importable by name (from minipar.parallel.pp import F, B) but left out of
# __all__, so that minipar.parallel's namespace gets no one-letter names; Kind.F spells them.
__all__ = ["Action", "Kind", "SEND_F", "RECV_F", "SEND_B", "RECV_B",
           "COMPUTE", "COMMUNICATION", "ScheduleError", "ScheduleDeadlockError", "parse_schedule",
           "format_schedule", "placement", "schedule", "SCHEDULES", "gpipe", "one_f_one_b",
           "interleaved_1f1b", "validate_schedule", "ScheduleInfo", "lower", "message",
           "Message", "dry_run", "DryRun", "Span", "check_deadlock", "peak_in_flight"]

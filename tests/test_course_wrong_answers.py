"""Wrong answers a learner writes, graded: each fails with the hint meant for it (and a
near miss that is right passes).

Each case edits lesson 01's solution the way a learner might get it wrong, grades the
result, and checks which exercises fail and what the report says. The graders run with
rendezvous sends (minipar.course.grading.LAUNCH), so a ring that would hang on NCCL is
reported as that deadlock, with the fix, not passed.
"""

from __future__ import annotations

import pytest

from minipar.course import find_lesson, grade

LESSON = find_lesson("01")

# id: (text of solution.py, what replaces it, exercises that must fail, words in the report)
WRONG_ANSWERS = {
    "reduce-scatter: blocking send before recv around the ring": (
        "        work = mp.isend(chunks[send_c], right, group=group)\n"
        "        got = mp.recv(left, group=group)  # the partial sum of chunk recv_c so far\n"
        "        work.wait()\n",
        "        mp.send(chunks[send_c], right, group=group)\n"
        "        got = mp.recv(left, group=group)\n",
        {"1.1", "1.3"},
        ["raised DeadlockError", "send blocks until the receiver posts its recv",
         "Post both sides at once (isend, then recv, then wait on the send",
         "alternate by parity", "smallest failing configuration: world_size=2"]),
    "all-gather: blocking send before recv around the ring": (
        "        work = mp.isend(chunks[send_c], right, group=group)\n"
        "        chunks[recv_c] = mp.recv(left, group=group)\n"
        "        work.wait()\n",
        "        mp.send(chunks[send_c], right, group=group)\n"
        "        chunks[recv_c] = mp.recv(left, group=group)\n",
        {"1.2", "1.3"},
        ["raised DeadlockError", "send blocks until the receiver posts its recv",
         "(at solution_wrong.py:"]),
    "right: reduce-scatter with an isend never waited on (its recv is posted)": (
        "        work.wait()\n        chunks[recv_c] = got + chunks[recv_c]\n",
        "        chunks[recv_c] = got + chunks[recv_c]\n",
        set(),
        []),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(WRONG_ANSWERS))
def test_a_wrong_answer_fails_with_its_hint(case, tmp_path):
    old, new, failing, words = WRONG_ANSWERS[case]
    solution = LESSON.path("solution").read_text(encoding="utf-8")
    assert solution.count(old) == 1, f"the case no longer matches solution.py: {old!r}"
    wrong = tmp_path / "solution_wrong.py"
    wrong.write_text(solution.replace(old, new), encoding="utf-8")
    lines: list[str] = []
    report = grade(LESSON, wrong, out=lines.append)
    text = "\n".join(lines)
    assert {o.exercise for o in report.outcomes if o.status != "passed"} == failing, text
    for w in words:
        assert w in text, f"{w!r} not in\n{text}"

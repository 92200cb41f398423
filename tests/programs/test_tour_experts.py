"""Tour part 13: a mixture of experts over ep = 4 in dp = 8 on the tour's 8 GPUs: every
(token, choice) pair either ran on an expert or was dropped, the drops are what capacity
leaves, a rank holds its E/ep experts, and the step is one device's."""

import re

from minipar.programs.tour import PARTS
from minipar.programs.tour.experts import DIMS, GLOBAL_BATCH, MODEL, experts_part


def test_part_13_accounts_for_every_choice_and_matches_one_device():
    assert PARTS[PARTS.index(experts_part) + 1].__name__ == "context_part"
    lines = []
    experts_part(lines.append)
    out = "\n".join(lines)
    assert lines[0].startswith("13. Mixture of experts")
    m, pairs = MODEL.moe, GLOBAL_BATCH * MODEL.seq_len * MODEL.moe.top_k
    blocks = re.findall(r"block \d: \(token, choice\) pairs each expert ran \[([\d, ]+)\]; "
                        r"(\d+) of (\d+) dropped \(an expert keeps (\d+) of", out)
    assert len(blocks) == MODEL.num_layers
    for kept, dropped, total, cap in blocks:
        kept = [int(k) for k in kept.split(",")]
        assert len(kept) == m.num_experts and int(total) == pairs
        assert sum(kept) + int(dropped) == pairs  # every choice ran or was dropped
        assert max(kept) <= int(cap) * DIMS.dp  # no expert over its capacity on any rank
    held = int(re.search(r"([\d,]+) held by a rank", out).group(1).replace(",", ""))
    assert held < MODEL.num_parameters()
    worst = float(re.search(r"worst difference ([\d.e+-]+) of the largest", out).group(1))
    assert worst < 1e-10

"""Tour part 12: dp 2 x pp 2 x tp 2 on the tour's 8 GPUs, its groups from the rank order,
its bytes by link class (only the pipeline crosses the two nodes), one device's loss."""

import re

from minipar.programs.tour import PARTS
from minipar.programs.tour.three_d import MICROBATCHES, MODEL, three_d_part


def test_part_12_shows_the_groups_the_bytes_and_one_devices_loss():
    assert PARTS[PARTS.index(three_d_part) + 1].__name__ == "experts_part"
    lines = []
    three_d_part(lines.append)
    out = "\n".join(lines)
    assert lines[0].startswith("12. 3-D parallelism")
    rows = re.findall(r"^\s+(\d) +(\d)   \((\d), (\d), (\d)\)\s+\{(\d),(\d)\}\s+\{(\d),(\d)\}"
                      r"\s+\{(\d),(\d)\}$", out, re.M)
    assert len(rows) == 8
    for rank, node, pp, dp, tp, *groups in (map(int, r) for r in rows):
        assert rank == tp + 2 * dp + 4 * pp and node == rank // 4 == pp
        assert groups == [rank - tp, rank - tp + 1, tp + 2 * dp, tp + 2 * dp + 4,
                          tp + 4 * pp, tp + 4 * pp + 2]  # tp, pp, dp
    traffic = re.findall(r"^   (\d)\s+(tp|pp|dp)\s+(\d+)\s+([\d,]+) B\s+([\d,]+) B$", out, re.M)
    assert len(traffic) == 6
    act = MODEL.seq_len * 1 * MODEL.hidden * 8  # [s, b, h], b = 4 / (2 x 2) = 1, float64
    for stage, kind, _, intra, inter in traffic:
        intra, inter = (int(x.replace(",", "")) for x in (intra, inter))
        if kind == "pp":
            assert intra == 0 and inter == MICROBATCHES * act + 8 * (stage == "1")
        else:
            assert inter == 0 and intra > 0
    tp0 = [int(t[3].replace(",", "")) for t in traffic if t[:2] == ("0", "tp")][0]
    # one block and the embedding, 2 micro-batches: 4 + 1 all-reduces each, 2(n-1)/n S = S
    assert tp0 == MICROBATCHES * (4 + 1) * act
    assert "(traffic.predict): True; groups whose bytes cross nodes: pp" in out
    loss, one = re.search(r"loss ([\d.]+) \(one device ([\d.]+)\)", out).groups()
    assert loss == one
    assert float(re.search(r"worst relative difference ([\d.e+-]+)", out).group(1)) < 1e-12

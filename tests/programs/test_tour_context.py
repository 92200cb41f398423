"""Tour part 14: ring attention and DeepSpeed-Ulysses over cp = 4 in each of the tour's two
nodes equal one device; the trace's FLOPs give zigzag 1/4 a rank and contiguous
(2r + 1)/16; the bytes a rank sent are K/V (cp − 1) times forward, K/V and dK/dV
(cp − 1) + cp times backward, and Ulysses' (cp − 1)/cp of four tensors each way."""

import re

from minipar.programs.tour import PARTS
from minipar.programs.tour.context import B, CP, HEAD_DIM, HEADS, S, context_part


def test_part_14_equals_one_device_balances_and_counts_its_bytes():
    assert PARTS[PARTS.index(context_part) + 1].__name__ == "planner_part"
    lines = []
    context_part(lines.append)
    out = "\n".join(lines)
    assert lines[0].startswith("14. Context parallelism")
    runs = re.findall(r"^   (ring attention|Ulysses)\s+(zigzag|contiguous): against one device, "
                      r"context ([\d.e+-]+), dqkv ([\d.e+-]+)(?:; each rank's share of the FLOPs "
                      r"([\d/ ]+))?$", out, re.M)
    assert len(runs) == 4
    shares = {}
    for form, layout, ctx_err, dqkv_err, share in runs:
        assert float(ctx_err) < 1e-13 and float(dqkv_err) < 1e-13
        if form == "Ulysses":  # each rank runs nn's own core on its heads: the same bits
            assert float(ctx_err) == float(dqkv_err) == 0.0
        else:
            shares[layout] = share.split()
    assert shares == {"zigzag": ["1/4"] * 4,
                      "contiguous": [f"{2 * r + 1}/16" for r in range(CP)]}
    sent = dict(re.findall(r"^   (ring attention|Ulysses)\s+bytes a rank sent: ([\d,]+ forward, "
                           r"[\d,]+ backward)", out, re.M))
    kv = 2 * (S // CP) * B * HEADS * HEAD_DIM * 8  # one rank's K and V, float64
    ring_fwd, ring_bwd = (CP - 1) * kv, (CP - 1) * kv + CP * kv
    uly = (CP - 1) / CP * 4 * (S // CP) * B * HEADS * HEAD_DIM * 8
    assert sent == {"ring attention": f"{ring_fwd:,} forward, {ring_bwd:,} backward",
                    "Ulysses": f"{uly:,.0f} forward, {uly:,.0f} backward"}
    assert out.count("costs.py says") == 2
    for shown, formula in re.findall(r"sent: ([\d,]+ forward, [\d,]+) backward .*costs.py says "
                                     r"([\d,]+ and [\d,]+)$", out, re.M):
        assert shown.replace(" forward,", " and") == formula

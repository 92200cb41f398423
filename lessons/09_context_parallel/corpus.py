"""Lesson 09's corpus: answers a learner writes, each a patch of solution.py. The wrong ones
must fail with the hint that names their bug; the right ones must pass everywhere."""

from minipar.course.corpus import right, wrong


def line(text: str, indent: int = 4) -> str:
    return " " * indent + text + "\n"


# -- the lines of solution.py the cases patch ----------------------------------------------
WEIGHT = line("w2 = np.where(x >= 0, 1.0 / (1.0 + small), small / (1.0 + small))  # block 2: sigmoid(x)")
MERGE_OUT = line("out = out1 - w2[..., None] * (out1 - out2)  # out: [..., m, d]")
MERGE_LSE = line("lse = np.maximum(lse1, lse2) + np.log1p(small)  # log(e^lse1 + e^lse2)")
MERGE = (line("x = lse2 - lse1  # x: [..., m]") + line("small = np.exp(-np.abs(x))  # <= 1: never overflows")
         + WEIGHT + MERGE_OUT + MERGE_LSE)

MIRROR = line("first, second = rank, 2 * cp - 1 - rank  # an early chunk and its mirror image")
CHUNK = line("c = s // (2 * cp)  # tokens a chunk")
POSITIONS = (line("return np.concatenate([np.arange(first * c, (first + 1) * c),")
             + line("np.arange(second * c, (second + 1) * c)])  # [s/cp]", 27))
SOURCE = line("src = (rank - step) % cp  # whose K/V arrived here after `step` moves")
KIND = line('return {(i, j): "full" if j < i else "diagonal" if j == i else "masked"')

FORWARD = line("ring_forward = (cp - 1) * shard * itemsize  # cp - 1 K/V sends")
BACKWARD = line("ring_backward = ring_forward + cp * shard * grad_itemsize  # K/V again, and dK/dV cp times")
ULYSSES_NONE = line("if num_heads % cp:")
ULYSSES = line("ulysses = 4 * (s // cp) * b * h * itemsize * (cp - 1) / cp  # 4 tensors, 1/cp kept", 8)
COMPUTE = line("step_compute = 2 * 2 * (2 * b * num_heads * c * c * head_dim) / peak_flops")
SEND = line("step_send = link.latency + shard * itemsize / link.bandwidth")


WRONG = [
    # 9.1 the log-sum-exp merge
    wrong("9.1", "misconception", "the sign inside the sigmoid turned: each block weighed by "
          "the other's share",
          old=line("x = lse2 - lse1  # x: [..., m]"), new=line("x = lse1 - lse2"),
          hint=["the blocks' weights are swapped", "sigmoid(lse2 − lse1)"]),
    wrong("9.1", "misconception", "the output merged, the lse left as block 1's",
          old=MERGE_LSE, new=line("lse = lse1"),
          hint=["your lse is lse1, unchanged", "the next merge"]),
    wrong("9.1", "misconception", "the merged lse taken as the larger of the two",
          old=MERGE_LSE, new=line("lse = np.maximum(lse1, lse2)"),
          hint=["max(lse1, lse2)", "log1p"]),
    wrong("9.1", "misconception", "the two outputs averaged with equal weights",
          old=MERGE_OUT, new=line("out = (out1 + out2) / 2"),
          hint=["equal weights", "share of the softmax denominator"]),
    wrong("9.1", "small-only", "the definition written out: exp(lse) overflows past 709.8",
          old=MERGE,
          new=(line("e1, e2 = np.exp(lse1), np.exp(lse2)")
               + line("out = (e1[..., None] * out1 + e2[..., None] * out2) / (e1 + e2)[..., None]")
               + line("lse = np.log(e1 + e2)")),
          hint=["exp(lse) overflows", "subtract the larger lse first"]),
    wrong("9.1", "small-only", "exp of the lse difference unguarded: right while the blocks' "
          "lse lie within 709 of each other",
          old=MERGE,
          new=(line("ratio = np.exp(lse2 - lse1)  # e^lse2 / e^lse1")
               + line("out = (out1 + ratio[..., None] * out2) / (1.0 + ratio)[..., None]")
               + line("lse = lse1 + np.log1p(ratio)")),
          hint=["the two blocks' lse differ by", "exponentiate only −|lse1 − lse2|"]),
    # 9.2 the zigzag layout and a ring step's chunk pairs
    wrong("9.2", "misconception", "zigzag pairs chunk r with 2cp − r",
          old=MIRROR, new=line("first, second = rank, 2 * cp - rank"),
          hint=["2·cp − r", "which does not exist", "2·cp − 1 − r"]),
    wrong("9.2", "misconception", "the contiguous layout's positions",
          old=CHUNK + MIRROR + POSITIONS,
          new=line("return np.arange(rank * (s // cp), (rank + 1) * (s // cp))"),
          hint=["contiguous layout's positions", "mirror 2·cp − 1 − r"]),
    wrong("9.2", "misconception", "chunks of s/cp tokens",
          old=CHUNK, new=line("c = s // cp"),
          hint=["your chunks are s/cp", "c = s/(2·cp)"]),
    wrong("9.2", "misconception", "the second chunk shifted by cp, not mirrored",
          old=MIRROR, new=line("first, second = rank, rank + cp"),
          hint=["a shift, not a mirror"]),
    wrong("9.2", "misconception", "the pair's kind decided by comparing the ranks",
          old=KIND,
          new=line('return {(i, j): "full" if src < rank else "diagonal" if src == rank else "masked"'),
          hint=["you compared the ranks", "not the chunks"]),
    wrong("9.2", "misconception", "the diagonal pair counted as full",
          old=KIND, new=line('return {(i, j): "full" if j <= i else "masked"'),
          hint=["j == i is diagonal, not full"]),
    wrong("9.2", "small-only", "the K/V taken from the rank ahead: right at cp = 2",
          old=SOURCE, new=line("src = (rank + step) % cp"),
          hint=["(r − t) mod cp", "the same rank when cp <= 2", "cp=3"]),
    # 9.3 a rank's bytes and the send that hides
    wrong("9.3", "misconception", "the backward sends what the forward sends: no dK/dV",
          old=BACKWARD, new=line("ring_backward = ring_forward"),
          hint=["ring_backward", "dK/dV accumulators"]),
    wrong("9.3", "misconception", "cp K/V sends a rank, not cp − 1",
          old=FORWARD, new=line("ring_forward = cp * shard * itemsize"),
          hint=["ring_forward", "you counted cp K/V sends"]),
    wrong("9.3", "misconception", "dK/dV counted in the inputs' dtype (bf16), not float32",
          old=BACKWARD, new=line("ring_backward = ring_forward + cp * shard * itemsize"),
          hint=["travel in float32 under bf16"]),
    wrong("9.3", "misconception", "every byte counted as float32",
          edits=[(FORWARD, line("ring_forward = (cp - 1) * shard * 4")),
                 (BACKWARD, line("ring_backward = ring_forward + cp * shard * 4")),
                 (ULYSSES, line("ulysses = 4 * (s // cp) * b * h * 4 * (cp - 1) / cp", 8)),
                 (SEND, line("step_send = link.latency + shard * 4 / link.bandwidth"))],
          hint=["4 bytes an element (float32) whatever the dtype"]),
    wrong("9.3", "misconception", "Ulysses counted without the 1/cp a rank keeps",
          old=ULYSSES, new=line("ulysses = 4 * (s // cp) * b * h * itemsize", 8),
          hint=["ulysses_forward", "a rank keeps 1/cp of each"]),
    wrong("9.3", "misconception", "Ulysses' all-to-alls counted for q, k and v only",
          old=ULYSSES, new=line("ulysses = 3 * (s // cp) * b * h * itemsize * (cp - 1) / cp", 8),
          hint=["four tensors", "the context"]),
    wrong("9.3", "misconception", "Ulysses priced whatever the head count",
          old=ULYSSES_NONE, new=line("if False:"),
          hint=["expected None", "does not divide num_heads"]),
    wrong("9.3", "misconception", "the send's latency left out",
          old=SEND, new=line("step_send = shard * itemsize / link.bandwidth"),
          hint=["step_send", "lacks the link's latency"]),
    wrong("9.3", "misconception", "the step's compute charged for the whole chunk rectangle",
          old=COMPUTE, new=line("step_compute = 4 * 2 * (2 * b * num_heads * c * c * head_dim) / peak_flops"),
          hint=["step_compute", "whole 2 × 2 chunk rectangle"]),
    wrong("9.3", "small-only", "the rank's own K/V sent once: right at cp = 2",
          old=FORWARD, new=line("ring_forward = shard * itemsize"),
          hint=["one send of the rank's own K/V", "cp=3"]),
]

RIGHT = [
    right("the merge by the larger lse, exponentiating only differences",
          old=MERGE,
          new=(line("top = np.maximum(lse1, lse2)  # top: [..., m]")
               + line("e1, e2 = np.exp(lse1 - top), np.exp(lse2 - top)  # each <= 1")
               + line("out = (e1[..., None] * out1 + e2[..., None] * out2) / (e1 + e2)[..., None]")
               + line("lse = top + np.log(e1 + e2)"))),
    right("the merge with np.logaddexp",
          old=MERGE,
          new=(line("lse = np.logaddexp(lse1, lse2)  # lse: [..., m]")
               + line("out = (np.exp(lse1 - lse)[..., None] * out1"
                      " + np.exp(lse2 - lse)[..., None] * out2)"))),
    right("zigzag positions from a mask over the sequence",
          old=POSITIONS,
          new=(line("chunk = np.arange(s) // c  # chunk: [s], each position's chunk")
               + line("return np.concatenate([np.flatnonzero(chunk == first), "
                      "np.flatnonzero(chunk == second)])"))),
    right("Ulysses' bytes as 4(cp − 1)·s·b·h·e / cp²",
          old=ULYSSES, new=line("ulysses = 4 * (cp - 1) * s * b * h * itemsize / cp**2", 8)),
]

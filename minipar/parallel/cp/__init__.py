"""Context parallelism: the sequence split over cp ranks through attention, the one layer
where tokens meet (every other layer is per token). Read in this order
(docs/context_parallel.md):

    layout.py     which tokens a rank holds: contiguous or zigzag chunks; shard, unshard
    blocks.py     which (query, key) chunk pairs a ring step computes under the causal
                  mask, and what it is charged
    merge.py      two partial attentions merged by their log-sum-exp
    blockwise.py  one block's attention and lse; its backward from the final lse
    ring.py       ring attention: K/V around the ring in forward, K/V and dK/dV in backward
    ulysses.py    DeepSpeed-Ulysses: all-to-all from sequence shards to head shards and back
    costs.py      bytes per rank per layer, and each rank's share of the causal work
    qkv.py        the checks of what both receive, and the heads taken apart

Only the context-parallel group is known here; how the mesh builds it, which dropout
generator it passes, and which groups reduce the gradients (dp x cp) are parallel/mesh's.
"""

from .blocks import Block, causal_allowed, pair_kind, plan_block
from .blockwise import block_backward, block_forward
from .costs import (AttentionBytes, attention_work, rank_units, ring_attention_bytes,
                    ring_attention_flops, ring_hidden_length, ulysses_attention_bytes)
from .layout import (LAYOUTS, check_layout, chunk_size, chunks, contiguous_chunks, positions,
                     sequence_order, shard, unshard, zigzag_chunks)
from .merge import logsigmoid, merge, merge_ref, sigmoid
from .ring import pass_around, ring_attention_backward, ring_attention_forward
from .ulysses import check_heads, ulysses_attention_backward, ulysses_attention_forward

__all__ = ["Block", "causal_allowed", "pair_kind", "plan_block", "block_forward",
           "block_backward", "AttentionBytes", "attention_work", "rank_units",
           "ring_attention_bytes", "ring_attention_flops", "ring_hidden_length",
           "ulysses_attention_bytes",
           "LAYOUTS", "check_layout", "chunk_size", "chunks", "contiguous_chunks",
           "positions", "sequence_order", "shard", "unshard", "zigzag_chunks", "logsigmoid",
           "merge", "merge_ref", "sigmoid", "pass_around", "ring_attention_forward",
           "ring_attention_backward", "check_heads", "ulysses_attention_forward",
           "ulysses_attention_backward"]

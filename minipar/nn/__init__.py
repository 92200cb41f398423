"""Single-device model pieces with explicit forward and backward (no parallelism here).

Activations are [s, b, h] (sequence first, as in Megatron-LM). Every layer has
`forward(x, ...) -> (y, saved)` and `backward(dy, saved) -> dx`; `saved` holds what the
backward needs and is charged to the device's ledger as activations until then. Every
layer is a `Module`: `parameters()` in the order its `parameter_order` lists.
"""

from .attention import CausalSelfAttention
from .block import Block, BlockParts, RemoteBlock, dense_parts
from .config import GPTConfig
from .embedding import Embedding
from .gpt import GPT, EmbedSaved, ForwardCache, HeadSaved
from .hooks import ROOT, block_unit
from .layernorm import LayerNorm
from .linear import Linear
from .matmul import matmul
from .mlp import MLP
from .module import Module
from .parameter import Parameter
from .saved import Saved
from .weight_grads import WeightGradStore

__all__ = ["CausalSelfAttention", "Block", "BlockParts", "RemoteBlock", "dense_parts",
           "GPTConfig", "Embedding", "GPT", "EmbedSaved", "ForwardCache", "HeadSaved", "ROOT",
           "block_unit", "LayerNorm", "Linear", "matmul", "MLP", "Module", "Parameter",
           "Saved", "WeightGradStore"]

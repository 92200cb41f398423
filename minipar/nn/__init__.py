"""Single-device model pieces with explicit forward and backward (no parallelism here).

Activations are [s, b, h] (sequence first, as in Megatron-LM). Every layer has
`forward(x, ...) -> (y, saved)` and `backward(dy, saved) -> dx`; `saved` holds what the
backward needs and is charged to the device's ledger as activations until then.
"""

from .attention import CausalSelfAttention
from .block import Block
from .config import GPTConfig
from .embedding import Embedding
from .gpt import GPT
from .layernorm import LayerNorm
from .linear import Linear
from .matmul import matmul
from .mlp import MLP
from .parameter import Parameter
from .saved import Saved

__all__ = ["CausalSelfAttention", "Block", "GPTConfig", "Embedding", "GPT", "LayerNorm",
           "Linear", "matmul", "MLP", "Parameter", "Saved"]

"""Deterministic data for training and for equivalence tests (NumPy only).

- `tokenizer`: `CharTokenizer` (sorted character vocabulary) and `ByteTokenizer`
  (UTF-8 bytes, vocabulary 256), saved and loaded as JSON.
- `corpus`: `load_corpus()`, a few kilobytes of English prose shipped with the package.
- `batches`: `synthetic_tokens`, `TokenStream` ([s, b] input/target batches, deterministic
  in (seed, step)), `split_microbatches`, `split_data_parallel` and
  `loss_scale_for_accumulation`.

    text = load_corpus()
    tok = CharTokenizer.from_text(text)
    stream = TokenStream(tok.encode(text), seq_len=64, seed=0)
    inputs, targets = stream.batch(step=0, global_batch=8)            # [64, 8] each
    mine = split_data_parallel(inputs, targets, dp_rank=1, dp_size=2)  # [64, 4] each
    for inp, tgt in split_microbatches(*mine, num_microbatches=2):     # [64, 2] each
        scale = loss_scale_for_accumulation(2)                         # 1/2
"""

from .batches import (
    TokenStream,
    loss_scale_for_accumulation,
    split_data_parallel,
    split_microbatches,
    synthetic_tokens,
)
from .corpus import load_corpus
from .tokenizer import ByteTokenizer, CharTokenizer, load_tokenizer

__all__ = [
    "ByteTokenizer",
    "CharTokenizer",
    "TokenStream",
    "load_corpus",
    "load_tokenizer",
    "loss_scale_for_accumulation",
    "split_data_parallel",
    "split_microbatches",
    "synthetic_tokens",
]

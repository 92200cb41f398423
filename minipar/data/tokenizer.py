"""Tokenizers: text to integer ids and back, small enough to read in one sitting.

Two tokenizers, both deterministic and both saved as plain JSON (never a pickle):

- `CharTokenizer`: one id per character of a fixed vocabulary. The vocabulary is the
  *sorted* set of characters of a text, so the same text always gives the same ids:
      vocab = sorted(set(text)),   id(c) = vocab.index(c)
  Small vocabularies keep the embedding and output layers tiny, which is what a
  teaching-sized model wants. A character outside the vocabulary is an error that names
  the character and its position.
- `ByteTokenizer`: the UTF-8 bytes of the text, vocabulary 256. Every string can be
  encoded; nothing is ever unknown.

`encode` returns a 1-D `np.ndarray` of int64 ids (the dtype the data pipeline and the
embedding lookups use); `decode` takes any 1-D sequence of integer ids.
"""

from __future__ import annotations

import json
import os
from typing import Sequence, Union

import numpy as np

PathLike = Union[str, "os.PathLike[str]"]

_FORMAT_VERSION = 1


def _as_ids(ids, vocab_size: int) -> np.ndarray:
    """Check `ids` is a 1-D sequence of integers in [0, vocab_size); return it as int64."""
    arr = np.asarray(ids)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(
            f"decode expects a 1-D sequence of ids, got shape {arr.shape}; "
            f"decode one sequence at a time (for a [s, b] batch, column j is batch[:, j])")
    if not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"decode expects integer ids, got dtype {arr.dtype}")
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        pos = int(bad[0])
        raise ValueError(
            f"id {int(arr[pos])} at position {pos} is outside the vocabulary "
            f"[0, {vocab_size})")
    return arr.astype(np.int64, copy=False)


class CharTokenizer:
    """One id per character: id i stands for `vocab[i]`, a list of distinct characters.

    `from_text` sorts the vocabulary, so equal texts give equal tokenizers; the
    constructor keeps whatever order it is given.

        tok = CharTokenizer.from_text(corpus)
        ids = tok.encode("data parallel")      # np.ndarray[int64], shape [13]
        tok.decode(ids) == "data parallel"
    """

    kind = "char"

    def __init__(self, vocab: Sequence[str]):
        vocab = list(vocab)
        if not vocab:
            raise ValueError("the vocabulary is empty: build it from a non-empty text")
        index: dict[str, int] = {}
        for i, c in enumerate(vocab):
            if not isinstance(c, str) or len(c) != 1:
                raise ValueError(
                    f"vocabulary entry {i} is {c!r}: every entry must be a single character")
            if c in index:
                raise ValueError(f"vocabulary lists the character {c!r} twice "
                                 f"(entries {index[c]} and {i})")
            index[c] = i
        self.vocab: list[str] = vocab
        self._index = index

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        """The tokenizer whose vocabulary is sorted(set(text))."""
        if not isinstance(text, str):
            raise TypeError(f"from_text expects a str, got {type(text).__name__}")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> np.ndarray:
        """text -> ids: [len(text)] int64. Unknown characters raise ValueError."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        index = self._index
        try:
            ids = [index[c] for c in text]
        except KeyError:
            pos, c = next((i, c) for i, c in enumerate(text) if c not in index)
            raise ValueError(
                f"character {c!r} (U+{ord(c):04X}) at position {pos} is not in the "
                f"vocabulary of {self.vocab_size} characters; build the tokenizer from a "
                f"text that contains it, or use ByteTokenizer, which encodes any text"
            ) from None
        return np.array(ids, dtype=np.int64)

    def decode(self, ids) -> str:
        """ids (1-D, integers in [0, vocab_size)) -> text."""
        arr = _as_ids(ids, self.vocab_size)
        vocab = self.vocab
        return "".join(vocab[i] for i in arr.tolist())

    def to_dict(self) -> dict:
        return {"kind": self.kind, "version": _FORMAT_VERSION, "vocab": list(self.vocab)}

    def save(self, path: PathLike) -> None:
        """Write the vocabulary as JSON (UTF-8): {"kind": "char", "version": 1, "vocab": [...]}."""
        _write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: PathLike) -> "CharTokenizer":
        tok = load_tokenizer(path)
        if not isinstance(tok, cls):
            raise ValueError(f"{os.fspath(path)} holds a {tok.kind!r} tokenizer, not a 'char' one")
        return tok

    def __eq__(self, other) -> bool:
        return isinstance(other, CharTokenizer) and self.vocab == other.vocab

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class ByteTokenizer:
    """The UTF-8 bytes of the text as ids; vocabulary 256, nothing is ever unknown.

    A character outside ASCII takes 2-4 ids. `decode` turns ids back into bytes and
    decodes them as UTF-8; with `errors="replace"` (the default) a byte sequence that is
    not valid UTF-8, as a model's samples may be, becomes U+FFFD instead of an error.
    Text that came from `encode` always decodes back exactly.
    """

    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        """text -> ids: [len(text.encode('utf-8'))] int64, each in [0, 256)."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids, errors: str = "replace") -> str:
        """ids (1-D, integers in [0, 256)) -> text; `errors` as for bytes.decode."""
        arr = _as_ids(ids, self.vocab_size)
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors=errors)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "version": _FORMAT_VERSION}

    def save(self, path: PathLike) -> None:
        """Write {"kind": "byte", "version": 1} as JSON."""
        _write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: PathLike) -> "ByteTokenizer":
        tok = load_tokenizer(path)
        if not isinstance(tok, cls):
            raise ValueError(f"{os.fspath(path)} holds a {tok.kind!r} tokenizer, not a 'byte' one")
        return tok

    def __eq__(self, other) -> bool:
        return isinstance(other, ByteTokenizer)

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=256)"


Tokenizer = Union[CharTokenizer, ByteTokenizer]


def tokenizer_from_dict(d: dict) -> Tokenizer:
    """Rebuild a tokenizer from `to_dict()` output, checking every field."""
    if not isinstance(d, dict) or "kind" not in d:
        raise ValueError("not a saved tokenizer: expected a JSON object with a 'kind' field")
    if d.get("version") != _FORMAT_VERSION:
        raise ValueError(f"saved tokenizer has format version {d.get('version')!r}; "
                         f"this code reads version {_FORMAT_VERSION}")
    if d["kind"] == "char":
        vocab = d.get("vocab")
        if not isinstance(vocab, list):
            raise ValueError("saved 'char' tokenizer has no 'vocab' list")
        return CharTokenizer(vocab)
    if d["kind"] == "byte":
        return ByteTokenizer()
    raise ValueError(f"unknown tokenizer kind {d['kind']!r}; expected 'char' or 'byte'")


def load_tokenizer(path: PathLike) -> Tokenizer:
    """Read a tokenizer saved by `save` (plain JSON; nothing is executed or unpickled)."""
    with open(path, "r", encoding="utf-8") as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{os.fspath(path)} is not valid JSON: {e}") from None
    return tokenizer_from_dict(d)


def _write_json(path: PathLike, d: dict) -> None:
    # ensure_ascii keeps the file plain ASCII whatever characters the vocabulary holds.
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=True, indent=1)
        f.write("\n")

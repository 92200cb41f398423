"""The bundled training text: a few kilobytes of plain ASCII English prose about how
large models are trained across many devices.

It ships inside the package (`minipar/data/corpus/*.txt`, declared as package data) and
is read through `importlib.resources`, so it is found the same way from a source
checkout, an editable install or an installed wheel.

    text = load_corpus()
    tok = CharTokenizer.from_text(text)
    tokens = tok.encode(text)           # [len(text)] int64, ready for TokenStream
"""

from __future__ import annotations

from importlib import resources

CORPUS_FILE = "parallel_training.txt"


def load_corpus() -> str:
    """The bundled corpus as one str (ASCII, paragraphs separated by blank lines)."""
    path = resources.files("minipar.data") / "corpus" / CORPUS_FILE
    return path.read_text(encoding="ascii")

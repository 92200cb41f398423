"""The bundled corpus: found through importlib.resources, ASCII, 4-8 KB, every letter."""

from __future__ import annotations

import string

import numpy as np

from minipar.data import CharTokenizer, load_corpus


def test_corpus_loads_and_is_plain_ascii():
    text = load_corpus()
    assert isinstance(text, str)
    assert text.isascii()
    assert set(text) <= set(string.printable) - set("\t\r\x0b\x0c")   # no tabs or CR
    assert text.endswith("\n")


def test_corpus_is_4_to_8_kb():
    n = len(load_corpus().encode("ascii"))
    assert 4 * 1024 <= n <= 8 * 1024, n


def test_corpus_contains_every_letter():
    text = load_corpus()
    assert set(string.ascii_lowercase) <= set(text)


def test_corpus_is_prose_with_a_small_character_vocabulary():
    text = load_corpus()
    assert text.count("\n\n") >= 5                 # several paragraphs
    assert len(text.split()) >= 700                # words, not filler
    assert CharTokenizer.from_text(text).vocab_size <= 96


def test_corpus_is_the_same_every_time():
    assert load_corpus() == load_corpus()


def test_corpus_has_structure_a_small_model_can_learn():
    """A count-based bigram model, fit on the first 90 %, predicts the last 10 % far
    better than a uniform guess: a character model's loss has room to fall visibly."""
    text = load_corpus()
    tok = CharTokenizer.from_text(text)
    ids, v = tok.encode(text), tok.vocab_size
    n = int(0.9 * ids.size)
    counts = np.full((v, v), 0.1)
    np.add.at(counts, (ids[:n - 1], ids[1:n]), 1.0)
    probs = counts / counts.sum(axis=1, keepdims=True)
    held_out = -np.log(probs[ids[n:-1], ids[n + 1:]]).mean()
    assert held_out < 0.75 * np.log(v), (held_out, np.log(v))

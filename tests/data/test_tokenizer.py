"""Tokenizers: exact round trips, clear errors, JSON save/load (no pickle)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minipar.data import ByteTokenizer, CharTokenizer, load_corpus, load_tokenizer

CORPUS = load_corpus()
ALPHABET = sorted(set(CORPUS))
TOK = CharTokenizer.from_text(CORPUS)


def test_vocabulary_is_sorted_distinct_characters_of_the_text():
    tok = CharTokenizer.from_text("banana band")
    assert tok.vocab == [" ", "a", "b", "d", "n"]
    assert tok.vocab_size == 5
    assert TOK.vocab == ALPHABET


def test_encode_hand_computed():
    tok = CharTokenizer.from_text("banana band")
    ids = tok.encode("and a ban")
    assert ids.dtype == np.int64 and ids.shape == (9,)
    assert ids.tolist() == [1, 4, 3, 0, 1, 0, 2, 1, 4]


@given(st.text(alphabet=ALPHABET))
def test_char_round_trip_over_corpus_alphabet(text):
    ids = TOK.encode(text)
    assert ids.dtype == np.int64
    assert ids.shape == (len(text),)
    assert ((ids >= 0) & (ids < TOK.vocab_size)).all()
    assert TOK.decode(ids) == text


def test_char_round_trip_of_whole_corpus():
    assert TOK.decode(TOK.encode(CORPUS)) == CORPUS


def test_empty_string():
    assert TOK.encode("").shape == (0,)
    assert TOK.encode("").dtype == np.int64
    assert TOK.decode([]) == ""
    assert TOK.decode(np.zeros(0, dtype=np.int64)) == ""


@given(st.text(alphabet=ALPHABET, max_size=20), st.sampled_from(["#", "\t", "é", "Q", "€"]),
       st.text(alphabet=ALPHABET, max_size=20))
def test_unknown_character_names_character_and_position(before, bad, after):
    assert bad not in TOK.vocab
    with pytest.raises(ValueError) as err:
        TOK.encode(before + bad + after)
    msg = str(err.value)
    assert repr(bad) in msg
    assert f"position {len(before)}" in msg
    assert "ByteTokenizer" in msg


def test_decode_rejects_ids_outside_vocabulary():
    with pytest.raises(ValueError,
                       match=r"id 50 at position 2 is outside the vocabulary \[0, 50\)"):
        TOK.decode([0, 1, 50])
    with pytest.raises(ValueError, match="id -1 at position 0"):
        TOK.decode([-1])
    with pytest.raises(TypeError, match="integer ids"):
        TOK.decode(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        TOK.decode(np.zeros((2, 2), dtype=np.int64))


def test_bad_vocabularies_are_refused():
    with pytest.raises(ValueError, match="twice"):
        CharTokenizer(["a", "b", "a"])
    with pytest.raises(ValueError, match="single character"):
        CharTokenizer(["a", "bc"])
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")


def test_char_save_load_json(tmp_path):
    path = tmp_path / "tok.json"
    TOK.save(path)
    raw = path.read_bytes()
    assert raw.isascii()
    d = json.loads(raw)
    assert d == {"kind": "char", "version": 1, "vocab": ALPHABET}
    back = CharTokenizer.load(path)
    assert back == TOK
    assert back.vocab == TOK.vocab
    assert load_tokenizer(path) == TOK
    assert np.array_equal(back.encode(CORPUS), TOK.encode(CORPUS))


def test_char_save_load_non_ascii_vocabulary(tmp_path):
    tok = CharTokenizer.from_text("Grüße, 世界! \n\"\\")
    path = tmp_path / "tok.json"
    tok.save(path)
    assert path.read_bytes().isascii()
    assert CharTokenizer.load(path).vocab == tok.vocab


def test_load_refuses_other_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_tokenizer(p)
    p.write_text(json.dumps({"kind": "bpe", "version": 1}))
    with pytest.raises(ValueError, match="unknown tokenizer kind 'bpe'"):
        load_tokenizer(p)
    p.write_text(json.dumps({"kind": "char", "version": 2, "vocab": ["a"]}))
    with pytest.raises(ValueError, match="version"):
        load_tokenizer(p)
    ByteTokenizer().save(p)
    with pytest.raises(ValueError, match="'byte' tokenizer, not a 'char'"):
        CharTokenizer.load(p)


@given(st.text())
def test_byte_round_trip_any_text(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == np.int64
    assert ids.shape == (len(text.encode("utf-8")),)
    assert ((ids >= 0) & (ids < 256)).all()
    assert tok.decode(ids) == text


def test_byte_tokenizer_hand_computed_and_save_load(tmp_path):
    tok = ByteTokenizer()
    assert tok.vocab_size == 256
    assert tok.encode("Aé").tolist() == [65, 0xC3, 0xA9]
    assert tok.decode([0xC3]) == "\ufffd"                    # invalid UTF-8 is replaced
    with pytest.raises(UnicodeDecodeError):
        tok.decode([0xC3], errors="strict")
    with pytest.raises(ValueError, match="id 256 at position 0"):
        tok.decode([256])
    path = tmp_path / "b.json"
    tok.save(path)
    assert json.loads(path.read_text()) == {"kind": "byte", "version": 1}
    assert ByteTokenizer.load(path) == tok
    assert isinstance(load_tokenizer(path), ByteTokenizer)

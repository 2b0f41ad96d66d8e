"""Incremental tokenisation of streamed text equals tokenising the whole text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamvox.models.qwen3_tts.text import IncrementalText, TextTokenizer, load_tokenizer
from tests.helpers.qwen3_tiny import build_tiny_checkpoint

ALPHABET = "abcdefgh XYZ  \n\t.,!?'-0123456789éü日本"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    d = build_tiny_checkpoint(tmp_path_factory.mktemp("tok"), "custom_voice")
    return TextTokenizer(load_tokenizer(d))


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=60), cuts=st.lists(st.integers(0, 60), max_size=12))
def test_any_split_gives_whole_text_ids(tokenizer, text, cuts):
    bounds = sorted({c for c in cuts if c <= len(text)} | {0, len(text)})
    inc = IncrementalText(tokenizer)
    ids: list[int] = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        ids += inc.feed(text[a:b])
    ids += inc.finish()
    assert ids == tokenizer.text_ids(text)


def test_last_word_is_held_back_until_a_boundary(tokenizer):
    inc = IncrementalText(tokenizer)
    assert inc.feed("Hello") == []
    assert inc.feed(" wor") == tokenizer.text_ids("Hello")
    assert inc.feed("ld") == []
    assert inc.finish() == tokenizer.text_ids(" world")

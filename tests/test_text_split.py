"""The one sentence/clause splitter: English output pinned, CJK cut without spaces, streaming equals whole."""

from __future__ import annotations

import random

import pytest

from streamvox.text_split import TextSplitter, split_text


def _words(prefix: str, start: int, stop: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(start, stop))


# (text, eSpeak's clauses (at most 24 words), sentences, clauses): what eSpeak's clause splitter and the
# speech-stream route's sentence and clause splitters returned before they became this one module.
GOLDEN = [
    (
        "Hello there, world. How are you? fine",
        ["Hello there,", "world.", "How are you?", "fine"],
        ["Hello there, world.", "How are you?", "fine"],
        ["Hello there,", "world.", "How are you?", "fine"],
    ),
    (
        "Streaming text arrives word by word, like tokens from a language model. Then it ends.",
        ["Streaming text arrives word by word,", "like tokens from a language model.", "Then it ends."],
        ["Streaming text arrives word by word, like tokens from a language model.", "Then it ends."],
        ["Streaming text arrives word by word,", "like tokens from a language model.", "Then it ends."],
    ),
    (
        "One sentence here. And a second one! A third without an end",
        ["One sentence here.", "And a second one!", "A third without an end"],
        ["One sentence here.", "And a second one!", "A third without an end"],
        ["One sentence here.", "And a second one!", "A third without an end"],
    ),
    (
        "Mr. Smith paid $3.14 for e.g. apples; then he left: quickly, quietly.\nNew line here.\n\nTwo lines later...",
        ["Mr.", "Smith paid $3.14 for e.g.", "apples;", "then he left:", "quickly,", "quietly.", "New line here.",
         "Two lines later..."],
        ["Mr.", "Smith paid $3.14 for e.g.", "apples; then he left: quickly, quietly.", "New line here.",
         "Two lines later..."],
        ["Mr.", "Smith paid $3.14 for e.g.", "apples;", "then he left:", "quickly,", "quietly.", "New line here.",
         "Two lines later..."],
    ),
    (
        "  Leading and trailing spaces.   Multiple   spaces\tand\ttabs inside, too!  ",
        ["Leading and trailing spaces.", "Multiple spaces and tabs inside,", "too!"],
        ["Leading and trailing spaces.", "Multiple   spaces\tand\ttabs inside, too!"],
        ["Leading and trailing spaces.", "Multiple   spaces\tand\ttabs inside,", "too!"],
    ),
    (
        "Wait?! Really... yes. No; maybe: perhaps, or not.",
        ["Wait?!", "Really...", "yes.", "No;", "maybe:", "perhaps,", "or not."],
        ["Wait?!", "Really...", "yes.", "No; maybe: perhaps, or not."],
        ["Wait?!", "Really...", "yes.", "No;", "maybe:", "perhaps,", "or not."],
    ),
    (
        " ... , ! ?",
        [],
        [],
        [],
    ),
    (
        "Quotes \"like this.\" And (parentheses, too). Numbers: 1,000 and 2.5 and 10:30.",
        ["Quotes \"like this.\" And (parentheses,", "too).", "Numbers:", "1,000 and 2.5 and 10:30."],
        ["Quotes \"like this.\" And (parentheses, too).", "Numbers: 1,000 and 2.5 and 10:30."],
        ["Quotes \"like this.\" And (parentheses,", "too).", "Numbers:", "1,000 and 2.5 and 10:30."],
    ),
    (
        "No punctuation at all just words running on and on",
        ["No punctuation at all just words running on and on"],
        ["No punctuation at all just words running on and on"],
        ["No punctuation at all just words running on and on"],
    ),
    (
        "Line one\nLine two, with a comma\r\nLine three. End.",
        ["Line one", "Line two,", "with a comma", "Line three.", "End."],
        ["Line one", "Line two, with a comma", "Line three.", "End."],
        ["Line one", "Line two,", "with a comma", "Line three.", "End."],
    ),
    (
        "",
        [],
        [],
        [],
    ),
    (
        _words("w", 0, 60) + ". " + _words("x", 0, 30),
        [_words("w", 0, 24), _words("w", 24, 48), _words("w", 48, 60) + ".", _words("x", 0, 24), _words("x", 24, 30)],
        [_words("w", 0, 60) + ".", _words("x", 0, 30)],
        [_words("w", 0, 60) + ".", _words("x", 0, 30)],
    ),
]


def _chunkings(text: str) -> list[list[str]]:
    """The text as words (each with its trailing space), one character at a time, and in 7-character parts."""
    words = text.split(" ")
    return [
        [word + (" " if i < len(words) - 1 else "") for i, word in enumerate(words)],
        list(text),
        [text[i : i + 7] for i in range(0, len(text), 7)],
    ]


def _streamed(splitter: TextSplitter, chunks: list[str]) -> list[str]:
    pieces = [piece for chunk in chunks for piece in splitter.add(chunk)]
    return pieces + splitter.add("", final=True)


@pytest.mark.parametrize("text, espeak, sentences, clauses", GOLDEN)
def test_english_text_is_cut_as_before(text, espeak, sentences, clauses):
    assert split_text(text, "clause", max_words=24) == espeak
    assert split_text(text, "sentence") == sentences
    assert split_text(text, "clause") == clauses
    for chunks in _chunkings(text):
        assert _streamed(TextSplitter("clause", max_words=24), chunks) == espeak
        assert _streamed(TextSplitter("sentence"), chunks) == sentences
        assert _streamed(TextSplitter("clause"), chunks) == clauses


def test_streamed_pieces_leave_as_soon_as_they_are_complete():
    splitter = TextSplitter("sentence")
    assert splitter.add("Hello there. How") == ["Hello there."]
    assert splitter.add(" are you? Fine") == ["How are you?"]
    assert splitter.add("", final=True) == ["Fine"]
    clauses = TextSplitter("clause")
    assert clauses.add("One, two; three") == ["One,", "two;"]
    assert clauses.add(" four.") == []  # no space yet: "four." may go on ("four.5")
    assert clauses.add("\n") == ["three four."]
    assert clauses.add("", final=True) == []


def test_cjk_punctuation_ends_a_piece_without_a_space():
    assert split_text("你好。再见！好吗？行", "sentence") == ["你好。", "再见！", "好吗？", "行"]
    assert split_text("一，二；三：四、五。六", "sentence") == ["一，二；三：四、五。", "六"]
    assert split_text("一，二；三：四、五。六", "clause") == ["一，", "二；", "三：", "四、", "五。", "六"]
    clauses = TextSplitter("clause")
    assert clauses.add("One, two; three") == ["One,", "two;"]
    assert clauses.add("你好。再见", final=True) == ["three你好。", "再见"]


def test_max_words_caps_each_piece_and_joins_its_words_with_single_spaces():
    assert split_text("a  b\tc d e, f", "clause", max_words=2) == ["a b", "c d", "e,", "f"]
    assert split_text("a  b\tc d e, f", "clause") == ["a  b\tc d e,", "f"]
    assert split_text(" ... , ! ?", "clause", max_words=2) == []


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError):
        split_text("Hi.", "paragraph")
    with pytest.raises(ValueError):
        TextSplitter("none")


def test_streamed_pieces_equal_the_whole_text_however_it_is_cut():
    rng = random.Random(40)
    alphabet = [*"ab ,.;:!?\n\t\r", "\u3002", "\uff0c", "\u3001", "\uff1f", "\u4f60"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        mode, max_words = rng.choice(("sentence", "clause")), rng.choice((None, 1, 3))
        cuts = sorted(rng.choices(range(len(text) + 1), k=rng.randint(0, 6)))
        chunks = [text[start:stop] for start, stop in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _streamed(TextSplitter(mode, max_words), chunks) == split_text(text, mode, max_words), (text, chunks)

"""Text side: the Qwen2-style byte-level BPE tokenizer and incremental tokenisation.

Upstream ships `vocab.json` + `merges.txt` + `tokenizer_config.json` (added tokens)
and lets transformers build the fast tokenizer; we build the same pipeline directly
with the `tokenizers` library (NFC, Qwen2 split regex, byte-level BPE, added tokens).
A `tokenizer.json`, when present, wins.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

# The Qwen2 pre-tokenizer split pattern.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def qwen2_pipeline(tok: Tokenizer) -> Tokenizer:
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    d = Path(model_dir)
    if (d / "tokenizer.json").exists():
        return Tokenizer.from_file(str(d / "tokenizer.json"))
    bpe = models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt"), unk_token=None)
    tok = qwen2_pipeline(Tokenizer(bpe))
    cfg_path = d / "tokenizer_config.json"
    if cfg_path.exists():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        added = sorted(((int(i), t) for i, t in (cfg.get("added_tokens_decoder") or {}).items()))
        for idx, t in added:
            token = AddedToken(
                t["content"],
                single_word=t.get("single_word", False),
                lstrip=t.get("lstrip", False),
                rstrip=t.get("rstrip", False),
                normalized=t.get("normalized", not t.get("special", False)),
                special=t.get("special", False),
            )
            if t.get("special", False):
                tok.add_special_tokens([token])
            else:
                tok.add_tokens([token])
            got = tok.token_to_id(t["content"])
            if got != idx:
                raise ValueError(f"added token {t['content']!r} got id {got}, config says {idx}")
    return tok


class TextTokenizer:
    """Encodes the prompts upstream builds around the text to speak."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def assistant_ids(self, text: str) -> list[int]:
        """`<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n` (3 + n + 5 ids)."""
        return self.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")

    def text_ids(self, text: str) -> list[int]:
        """Ids of the text alone, as they sit inside the assistant prompt."""
        return self.assistant_ids(text)[3:-5]

    def role_ids(self) -> list[int]:
        return self.assistant_ids("")[:3]

    def instruct_ids(self, instruct: str) -> list[int]:
        return self.encode(f"<|im_start|>user\n{instruct}<|im_end|>\n")

    def ref_text_ids(self, ref_text: str) -> list[int]:
        """Reference transcript ids without the role header and trailer (upstream `[3:-2]`)."""
        return self.encode(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")[3:-2]


class IncrementalText:
    """Turns text that arrives in pieces into ids identical to tokenising it whole.

    Qwen2's split regex attaches a space to the word after it, and no pre-token spans a
    point where whitespace is followed by non-whitespace. So everything before the last
    such point tokenises the same whatever comes later; the tail after it (the last,
    possibly partial, word) is held back until more text or `finish()`.
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.pending = ""
        self.done = False

    def feed(self, text: str) -> list[int]:
        self.pending += text
        cut = _last_word_start(self.pending)
        if cut <= 0:
            return []
        head, self.pending = self.pending[:cut], self.pending[cut:]
        return self.tokenizer.text_ids(head)

    def finish(self) -> list[int]:
        self.done = True
        head, self.pending = self.pending, ""
        return self.tokenizer.text_ids(head) if head else []


def _last_word_start(s: str) -> int:
    """Index of the last whitespace char that is followed by a non-whitespace char (-1 if none)."""
    for i in range(len(s) - 2, -1, -1):
        if s[i].isspace() and not s[i + 1].isspace():
            return i
    return -1

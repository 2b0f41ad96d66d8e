"""Pronunciations for the aligner: CMUdict's where it has the word, else eSpeak's phonemes in ARPAbet.

eSpeak also reads what the dictionary cannot: numbers ("1234", "5.5", "3rd"), abbreviations,
names and made-up words, the way a TTS model usually says them. Its English phoneme names map
onto the acoustic model's ARPAbet phones roughly (one to one, or one to two for r-coloured vowels).
"""

from __future__ import annotations

import re

# eSpeak's English phoneme names (stress marks removed) -> ARPAbet
_ESPEAK_TO_ARPABET = {
    "a": "AE", "aa": "AE", "a#": "AH", "A:": "AA", "A@": "AA R", "aI": "AY", "aI@": "AY ER", "aI3": "AY ER",
    "aU": "AW", "@": "AH", "@-": "AH", "@2": "AH", "@5": "AH", "@L": "AH L", "3": "ER", "3:": "ER", "e": "EH",
    "E": "EH", "e@": "EH R", "eI": "EY", "i": "IY", "i:": "IY", "i@": "IH R", "i@3": "IH R", "I": "IH",
    "I2": "IH", "I#": "IH", "0": "AA", "O": "AO", "O:": "AO", "O2": "AO", "O@": "AO R", "o@": "AO R",
    "OI": "OY", "o": "OW", "oU": "OW", "u": "UW", "u:": "UW", "U": "UH", "U@": "UH R", "V": "AH",
    "b": "B", "d": "D", "D": "DH", "dZ": "JH", "f": "F", "g": "G", "h": "HH", "j": "Y", "k": "K", "x": "K",
    "l": "L", "l-": "L", "m": "M", "n": "N", "n-": "N", "N": "NG", "p": "P", "r": "R", "r-": "R", "s": "S",
    "S": "SH", "t": "T", "t#": "T", "t2": "T", "T": "TH", "tS": "CH", "v": "V", "w": "W", "z": "Z", "Z": "ZH",
}
_STRESS = re.compile(r"[',%=]")
_TOKEN_EDGES = re.compile(r"^[^\w']+|[^\w']+$")
_SENTENCE_PUNCTUATION = re.compile(r"^[\"'(\[{]+|[.,;:!?\"')\]}]+$")


def arpabet(espeak_phonemes: list[str]) -> list[str]:
    """eSpeak phoneme names -> ARPAbet phones; names with no counterpart (a glottal stop, a pause) are dropped."""
    phones = []
    for name in espeak_phonemes:
        name = _STRESS.sub("", name)
        mapped = _ESPEAK_TO_ARPABET.get(name) or _ESPEAK_TO_ARPABET.get(name.rstrip("0123456789#-;"))
        if mapped:
            phones += mapped.split()
    return phones


def dictionary_key(word: str) -> str:
    """How a word of the input is looked up: lower case, without the punctuation around it ("Dr." -> "dr")."""
    return _TOKEN_EDGES.sub("", word.lower())


def spoken_form(word: str) -> str:
    """A word as it is read: lower case, without the sentence punctuation around it, but with the symbols
    that are read out ("15%," -> "15%", "$5" -> "$5"); no parentheses (they mark alternatives in the
    dictionary)."""
    return _SENTENCE_PUNCTUATION.sub("", word.lower()).replace("(", "").replace(")", "")


def spoken(word: str) -> bool:
    """False for a word with no letter or digit ("-", "..."): nothing of it is heard."""
    return any(ch.isalnum() for ch in word)


def needs_espeak(key: str) -> bool:
    """Numbers are read by eSpeak whatever the dictionary says ("2" is there, "1234" is not)."""
    return any(ch.isdigit() for ch in key)

"""A ctypes binding of libespeak-ng: the few calls synthesis needs, and OpenAI's voice names.

The shared library and its data come from the `espeakng-loader` wheel
(eSpeak NG is GPL-3.0); nothing is downloaded.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Callable
from typing import NamedTuple

import espeakng_loader
import numpy as np

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_ENDPAUSE = 0x1000
_RATE = 1
_BUFFER_MS = 50
_PHONEME_SEPARATOR = ord("_") << 8  # espeak_TextToPhonemes: "_" between phoneme names

DEFAULT_WPM = 175  # eSpeak's speaking rate at speed 1.0, in words per minute
MIN_WPM, MAX_WPM = 80, 450  # the rates eSpeak accepts

# OpenAI's voice names (every name in the `openai` SDK's speech and realtime voice lists), so clients written
# for OpenAI TTS work unmodified: an English voice, most with an eSpeak variant of the voice's gender.
# docs/voices.md lists the mapping.
OPENAI_VOICE_ALIASES = {
    "alloy": "en-us",
    "ash": "en-us+m3",
    "ballad": "en+m2",
    "cedar": "en-us+m5",
    "coral": "en-us+f2",
    "echo": "en-us+m1",
    "fable": "en",
    "marin": "en-us+f5",
    "nova": "en-us+f3",
    "onyx": "en-us+m7",
    "sage": "en-us+f4",
    "shimmer": "en-us+f1",
    "verse": "en+m4",
}

# espeak_EVENT_TYPE values this binding reports
EVENT_WORD, EVENT_SENTENCE, EVENT_END = 1, 2, 5
_EVENT_LIST_TERMINATED = 0
_REPORTED_EVENTS = (EVENT_WORD, EVENT_SENTENCE, EVENT_END)


class _Event(ctypes.Structure):
    """`espeak_EVENT` (speak_lib.h): 40 bytes on x86_64, `user_data` at offset 24 and the `id` union at 32."""

    _fields_ = [
        ("type", ctypes.c_int),  # an enum
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # characters (not bytes) from 1, within the synthesised text
        ("length", ctypes.c_int),  # of the word, in characters
        ("audio_position", ctypes.c_int),  # milliseconds
        ("sample", ctypes.c_int),  # samples from the start of this espeak_Synth call
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_void_p),  # union { int number; const char *name; char string[8]; }
    ]


class SynthEvent(NamedTuple):
    """A synthesis event: `kind` one of `EVENT_WORD`, `EVENT_SENTENCE`, `EVENT_END`."""

    kind: int
    text_position: int  # characters from 1 within the text given to `synthesize`
    length: int  # characters (words only)
    sample: int  # samples from the start of that text's audio


_SynthCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                  ctypes.POINTER(_Event))


class _Voice(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_char_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


class EspeakLibrary:
    """A thin ctypes binding to the few libespeak-ng calls synthesis needs."""

    def __init__(self) -> None:
        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self._lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        self.sample_rate = self._lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, espeakng_loader.get_data_path().encode(), 0
        )
        if self.sample_rate <= 0:
            raise RuntimeError("eSpeak NG failed to initialise")
        self._on_samples = None
        self._events: list[SynthEvent] | None = None
        self._text_to_phonemes = None
        self._callback = _SynthCallback(self._dispatch)  # kept referenced while the library holds it
        self._lib.espeak_SetSynthCallback(self._callback)

    def languages(self) -> list[str]:
        """The language names of the installed voices (eSpeak's voice ids), sorted."""
        voices = self._lib.espeak_ListVoices(None)
        names = set()
        i = 0
        while voices[i]:
            # `languages` is a list of (priority byte, NUL-terminated name); the first is the main one.
            raw = voices[i].contents.languages
            if raw:
                names.add(raw[1:].decode())
            i += 1
        return sorted(names)

    def set_voice(self, name: str) -> bool:
        return self._lib.espeak_SetVoiceByName(name.encode()) == 0

    def voice_works(self, name: str) -> bool:
        """True when the voice loads with its dictionary (eSpeak lists a few that do not)."""
        with tempfile.TemporaryFile() as captured:  # eSpeak reports a missing dictionary on fd 2 only
            saved = os.dup(2)
            os.dup2(captured.fileno(), 2)
            try:
                loaded = self.set_voice(name)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            captured.seek(0)
            return loaded and not captured.read()

    def drop_queued_events(self) -> None:
        """Take the events that voice changes leave for the next synthesis, in an empty one.

        Each voice change queues a sample-rate event for the next synthesis's first buffer, whose event
        list holds 30: after the hundred-odd changes of `voice_works` over every voice, they pushed that
        buffer's sentence and word events (the first word's) out of it.
        """
        self.synthesize("", lambda _samples: True)

    def set_rate(self, words_per_minute: int) -> None:
        self._lib.espeak_SetParameter(_RATE, words_per_minute, 0)

    def phonemes(self, text: str) -> list[str]:
        """eSpeak's phoneme names (its ASCII alphabet, stress marks attached) for `text`, in the current voice."""
        if self._text_to_phonemes is None:
            self._text_to_phonemes = self._lib.espeak_TextToPhonemes
            self._text_to_phonemes.restype = ctypes.c_char_p
            self._text_to_phonemes.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
        cursor = ctypes.c_char_p(text.encode())  # advanced clause by clause; NULL at the end
        names = []
        while cursor.value:
            clause = self._text_to_phonemes(ctypes.byref(cursor), _CHARS_UTF8, _PHONEME_SEPARATOR)
            names += (clause or b"").decode().replace(" ", "_").split("_")
        return [name for name in names if name]

    def synthesize(self, text: str, on_samples: Callable[[np.ndarray], bool],
                   events: list[SynthEvent] | None = None) -> None:
        """Synthesise `text`, calling `on_samples(int16 array) -> bool` per buffer; False aborts.

        With `events`, eSpeak's word, sentence and end events are appended to it, each before the
        `on_samples` call of the buffer that holds it.
        """
        data = text.encode()
        self._on_samples = on_samples
        self._events = events
        try:
            self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None)
        finally:
            self._on_samples = None
            self._events = None

    def _dispatch(self, wav, num_samples: int, events) -> int:
        if self._events is not None and events:
            i = 0
            while (event := events[i]).type != _EVENT_LIST_TERMINATED:
                if event.type in _REPORTED_EVENTS:
                    self._events.append(SynthEvent(event.type, event.text_position, event.length, event.sample))
                i += 1
        if num_samples <= 0 or self._on_samples is None:
            return 0
        samples = np.ctypeslib.as_array(wav, (num_samples,)).copy()
        return 0 if self._on_samples(samples) else 1

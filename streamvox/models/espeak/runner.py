"""The embedded default voice: eSpeak NG, a single-stage generator model, behind the runner contract.

eSpeak NG keeps global synthesis state (its random generator, pitch flutter,
voice-variant settings) that carries from one text into the next, so the same
request would sound slightly different depending on what was spoken before
it. Each request therefore runs in its own process forked from a pristine
copy of the engine core's start-up state (`forkserver.py`): every request
starts from the same state, requests cannot leak into each other, and they
synthesise in parallel. This runner hands each child its request and text,
and forwards the audio the children write to the engine core.

A text with nothing to say ("...", an emoji) makes no sound in eSpeak; its
reply is a short silence, as a pause, so that every reply is audio a client
can decode (clients' decoders and agents' TTS plugins treat an empty reply
as an error). An OpenAI voice name with a `language` speaks that language
with the name's variant ("nova" in "de" is "de+f3").
"""

from __future__ import annotations

import ctypes
import os
import selectors
import time

import numpy as np

from streamvox.contract import ModelInfo, OutputSink, RequestError, SpeechRequest
from streamvox.models.espeak.forkserver import BACKGROUND_RUNNING_PER_CPU, BackgroundSlots, Child, ChildSpec, ForkServer
from streamvox.models.espeak.library import DEFAULT_WPM, OPENAI_VOICE_ALIASES, EspeakLibrary

_SILENCE_S = 0.1  # the reply to a text with nothing to say


class EspeakRunner:
    """Runs each eSpeak NG request in a child process forked from a pristine state."""

    def __init__(self, name: str = "espeak", poll_interval_s: float = 0.0,
                 max_running_background: int | None = None) -> None:
        self._espeak = EspeakLibrary()
        self._languages = [name for name in self._espeak.languages() if self._espeak.voice_works(name)]
        self._espeak.set_voice("en-us")  # the state every child starts from
        self._espeak.drop_queued_events()
        voices = sorted(OPENAI_VOICE_ALIASES) + self._languages
        self.info = ModelInfo(
            name=name,
            family="espeak",
            sample_rate=self._espeak.sample_rate,
            voices=voices,
            default_voice="en-us",
            languages=self._languages,
            streaming_text=True,
            native_speed=False,  # its rate setting misses duration/speed by up to 50%: the core time-stretches
            word_timestamps=True,  # eSpeak's own synthesis events (word_timing.py)
        )
        self._forks = ForkServer(self._espeak, ctypes.CDLL(None, use_errno=True).prctl)
        self._forks.ask()  # the first request starts without waiting for a fork
        self._children: dict[str, Child] = {}
        self._texts: set[str] = set()  # requests whose text has more than whitespace
        self._by_fd: dict[int, str] = {}
        self._poll_interval_s = poll_interval_s
        # Children's audio pipes, registered once (epoll): a step costs O(ready pipes), not O(children).
        self._selector = selectors.DefaultSelector()
        # The subset whose first audio has not come yet: the core watches it even while it lets
        # the others' output collect for a moment, so a first packet is never held back.
        self._fresh = selectors.DefaultSelector()
        if max_running_background is None:
            max_running_background = BACKGROUND_RUNNING_PER_CPU * len(os.sched_getaffinity(0))
        self._background = BackgroundSlots(max_running_background, self.info.sample_rate)

    def add(self, request: SpeechRequest) -> None:
        voice = request.voice or request.language or self.info.default_voice
        if voice not in self.info.voices:
            param = "voice" if request.voice else "language"
            raise RequestError(f"Unknown {param} '{voice}' for model '{self.info.name}'.", param=param)
        espeak_voice = OPENAI_VOICE_ALIASES.get(voice, voice)
        if request.voice in OPENAI_VOICE_ALIASES and request.language in self._languages:
            variant = espeak_voice.partition("+")[2]
            espeak_voice = request.language + (f"+{variant}" if variant else "")
        spec = ChildSpec(espeak_voice, int(round(DEFAULT_WPM * request.speed)), request.text, request.text_complete,
                         request.word_timestamps)
        if request.text.strip():
            self._texts.add(request.request_id)
        child = self._forks.take()
        self._forks.ask()  # the next request starts without waiting for a fork
        child.start(spec)
        self._children[request.request_id] = child
        self._by_fd[child.audio_fd] = request.request_id
        self._selector.register(child.audio_fd, selectors.EVENT_READ, request.request_id)
        self._fresh.register(child.audio_fd, selectors.EVENT_READ, request.request_id)

    def feed_text(self, request_id: str, text: str) -> None:
        if (child := self._children.get(request_id)) is not None:
            child.send_text(text)
            if text.strip():
                self._texts.add(request_id)

    def end_input(self, request_id: str) -> None:
        if (child := self._children.get(request_id)) is not None and child.input_open:
            child.end_input()
            if not child.fresh:  # the child makes itself background work (SCHED_IDLE)
                self._background.add(request_id, child)

    def release(self, request_id: str) -> None:
        self._texts.discard(request_id)
        if (child := self._children.pop(request_id, None)) is not None:
            del self._by_fd[child.audio_fd]
            self._selector.unregister(child.audio_fd)
            self._background.remove(request_id)
            if child.fresh:
                self._fresh.unregister(child.audio_fd)
            child.close()

    def has_work(self) -> bool:
        return bool(self._children)

    def close(self) -> None:
        """Stop every request and the fork server."""
        for request_id in list(self._children):
            self.release(request_id)
        self._forks.close()

    def fileno(self) -> int:
        """Readable when a child has written: the core waits on it instead of spinning while children run."""
        return self._selector.fileno()

    def first_output_fileno(self) -> int:
        """Readable when a request that has produced nothing yet writes: its first packet is due."""
        return self._fresh.fileno()

    def step(self, sink: OutputSink) -> None:
        """Forward whatever audio the children have written (waiting up to `poll_interval_s` if none has).

        The core calls this when `fileno()` is readable, so by default it never waits.
        """
        for key, _ in self._selector.select(self._poll_interval_s):
            request_id = key.data
            child = self._children.get(request_id)
            if child is None:  # released earlier in this step
                continue
            try:
                data = child.read()
            except BlockingIOError:
                continue
            if child.fresh and child.has_audio():
                child.fresh = False
                child.first_audio_at = time.monotonic()
                self._fresh.unregister(key.fd)
                if not child.input_open:  # the child has made itself background work (SCHED_IDLE)
                    self._background.add(request_id, child)
            self._forward(request_id, child, sink, eof=not data)
        self._background.balance()

    def _forward(self, request_id: str, child: Child, sink: OutputSink, eof: bool) -> None:
        """Send every complete frame in the child's buffer as one delta (fewer, larger deltas under load)."""
        data, timings, finished = child.take_output()
        if data:
            pcm = np.frombuffer(data, dtype="<i2")
            child.samples += len(pcm)
            sink.audio(request_id, pcm.astype(np.float32) / 32768.0)
        for words in timings:  # each follows the audio it times (the child writes it after that)
            sink.words(request_id, words)
        if finished is not None:
            if not child.samples and request_id in self._texts:
                sink.audio(request_id, np.zeros(round(_SILENCE_S * self.info.sample_rate), np.float32))
            self.release(request_id)
            sink.finished(request_id, "stop", *finished)
        elif eof:
            self.release(request_id)
            sink.failed(request_id, RequestError("eSpeak synthesis failed.", code="synthesis_failed"))

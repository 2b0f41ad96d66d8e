"""What the voice agent keeps for one session and for one thinker reply, apart from the protocol's own state.

`TurnState` belongs to a session: the server VAD over its input audio (and the turn it is hearing), the
transcriptions still running, which a thinker reply waits for, and a VAD turn's reply waiting for its
transcript. `ThinkerReply` belongs to a response the thinker writes: what it answers, how far it got, and the
report sent back with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np

from streamvox.agent.errors import StageError
from streamvox.agent.vad import SileroModel, SileroVad, VadEvent, VadSettings, hear

log = logging.getLogger(__name__)
_SLICE_S = 1.0  # the most input audio the VAD hears between two turns of the event loop


class TurnState:
    """A session's server VAD, the turn it is hearing, and its transcriptions in flight."""

    def __init__(self) -> None:
        self.vad: SileroVad | None = None
        self.speech_item_id: str | None = None  # the item the speech being heard will become
        self.speech_start_ms: int | None = None  # where that item's audio starts (its audio_start_ms)
        self.epoch = 0  # counts the input buffer's clears: events of audio heard before the last one are dropped
        self.unheard: list[tuple[int, SileroVad, np.ndarray]] = []  # audio waiting for the VAD, in order
        self.listening: asyncio.Task | None = None  # runs the VAD over `unheard`
        self.transcriptions: dict[str, asyncio.Task] = {}  # item id -> its transcription
        self.pending_reply: asyncio.Task | None = None  # a VAD turn's response, waiting for its transcript

    def vad_for(self, settings: VadSettings, sample_rate: int, position_ms: int) -> SileroVad:
        """The session's VAD with `settings`; a new one (counting from `position_ms`, where the audio it is
        about to hear starts) when there was none or the input rate changed."""
        vad = self.vad
        if vad is None or vad.sample_rate != sample_rate:
            vad = self.vad = SileroVad(settings, sample_rate, origin_ms=position_ms)
        vad.settings = settings
        return vad

    def listen(self, vad: SileroVad, samples: np.ndarray, on_event: Callable[[VadEvent], Awaitable[None]]) -> None:
        """Have `vad` hear the next samples in a task of the session's own, and `on_event` handle what it hears,
        in order. The caller does not wait, and audio that arrives while the task is busy is heard in one go.

        The VAD runs on the event loop: about 0.1 ms of CPU per 20 ms of audio, and with 32 sessions talking the
        loop's lag stays within a few ms of its lag without VAD (benchmarks/vad_bench.py). A hop to a worker
        thread costs more than it saves on a busy machine: it put barge-in detection's p99 at 190 ms, against
        26 ms on the loop, with two CPU-bound processes on two cores (benchmarks/barge_in_bench.py)."""
        self.unheard.append((self.epoch, vad, samples))
        if self.listening is None or self.listening.done():
            self.listening = asyncio.create_task(self._listen(on_event))

    async def _listen(self, on_event: Callable[[VadEvent], Awaitable[None]]) -> None:
        if not SileroModel.loaded():  # once per process; not on the loop
            await asyncio.to_thread(SileroModel.shared)
        while self.unheard:
            segments, self.unheard = self.unheard, []
            for epoch, vad, samples in segments:
                # A long append is heard a slice at a time, the loop free between slices: a minute of audio is
                # about 0.3 s of CPU, which every other session would wait for.
                step = max(1, round(vad.sample_rate * _SLICE_S))
                for start in range(0, len(samples), step):
                    if start:
                        await asyncio.sleep(0)
                    for heard, event in hear([(epoch, vad, samples[start : start + step])]):
                        if heard != self.epoch:
                            continue  # heard in audio that was cleared since
                        try:
                            await on_event(event)
                        except Exception:  # a bug must not stop the session's VAD
                            log.exception("handling a VAD event failed")

    def forget_speech(self) -> None:
        """The input buffer was cleared: the speech being heard is not a turn any more."""
        self.epoch += 1
        self.speech_item_id = self.speech_start_ms = None

    def drop_pending_reply(self) -> None:
        if self.pending_reply is not None:
            self.pending_reply.cancel()
            self.pending_reply = None

    def track(self, item_id: str, transcription: asyncio.Task) -> None:
        self.transcriptions[item_id] = transcription
        transcription.add_done_callback(lambda _: self.transcriptions.pop(item_id, None))

    async def transcribed(self) -> None:
        """Wait for the transcriptions running now (failed ones included)."""
        if self.transcriptions:
            await asyncio.gather(*list(self.transcriptions.values()), return_exceptions=True)

    def close(self) -> None:
        self.drop_pending_reply()
        if self.listening is not None:
            self.listening.cancel()
        for task in list(self.transcriptions.values()):
            task.cancel()


@dataclass
class ThinkerReply:
    """A response the thinker writes."""

    instructions: str  # the system message
    input_items: list[dict] | None = None  # the response's own input; None: the conversation
    report: dict = field(default_factory=dict)  # sent as the response's "streamvox": timings_ms, thinker state
    error: StageError | None = None  # the thinker failed
    finish_reason: str | None = None  # why the LLM stopped ("length": at max_output_tokens)
    task: asyncio.Task | None = None  # a text-only reply's thinker stream, cancelled with the response

"""What the voice agent keeps for one session and for one thinker reply, apart from the protocol's own state.

`TurnState` belongs to a session: the server VAD over its input audio (and the turn it is hearing), the
transcriptions still running, which a thinker reply waits for, and a VAD turn's reply waiting for its
transcript. `ThinkerReply` belongs to a response the thinker writes: what it answers, how far it got, and the
report sent back with it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from streamvox.agent.errors import StageError
from streamvox.agent.vad import SileroModel, SileroVad, VadEvent, VadSettings


class TurnState:
    """A session's server VAD, the turn it is hearing, and its transcriptions in flight."""

    def __init__(self) -> None:
        self.vad: SileroVad | None = None
        self.speech_item_id: str | None = None  # the item the speech being heard will become
        self.speech_start_ms: int | None = None  # where that item's audio starts (its audio_start_ms)
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

    async def hear(self, vad: SileroVad, samples: np.ndarray) -> list[VadEvent]:
        """Run `vad` over the next samples, on the event loop: about 0.1 ms of CPU per 20 ms of audio, less
        than a hop to a worker thread costs the loop (benchmarks/vad_bench.py). The model is loaded once per
        process, in a worker thread."""
        if not SileroModel.loaded():
            await asyncio.to_thread(SileroModel.shared)
        return vad.process(samples)

    def forget_speech(self) -> None:
        """The input buffer was cleared: the speech being heard is not a turn any more."""
        if self.vad is not None:
            self.vad.forget_speech()
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
        for task in list(self.transcriptions.values()):
            task.cancel()


@dataclass
class ThinkerReply:
    """A response the thinker writes."""

    instructions: str  # the system message
    input_items: list[dict] | None = None  # the response's own input; None: the conversation
    report: dict = field(default_factory=dict)  # sent as the response's "streamvox": timings_ms, thinker state
    error: StageError | None = None  # the thinker failed
    task: asyncio.Task | None = None  # a text-only reply's thinker stream, cancelled with the response

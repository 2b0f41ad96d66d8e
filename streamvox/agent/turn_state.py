"""What the voice agent keeps for one session and for one thinker reply, apart from the protocol's own state.

`TurnState` belongs to a session: the server VAD over its input audio (and the turn it is hearing) and the
transcriptions still running, which a thinker reply waits for. `ThinkerReply` belongs to a response the thinker
writes: what it answers, how far it got, and the report sent back with it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from streamvox.agent.errors import StageError
from streamvox.agent.vad import EnergyVad, VadSettings


class TurnState:
    """A session's server VAD and its transcriptions in flight."""

    def __init__(self) -> None:
        self.vad: EnergyVad | None = None
        self.speech_item_id: str | None = None  # the item the speech being heard will become
        self.transcriptions: dict[str, asyncio.Task] = {}  # item id -> its transcription

    def vad_for(self, settings: VadSettings, sample_rate: int) -> EnergyVad:
        """The session's VAD, new when its settings or the input rate changed."""
        vad = self.vad
        if vad is None or vad.settings != settings or vad.sample_rate != sample_rate:
            vad = self.vad = EnergyVad(settings, sample_rate)
        return vad

    def reset_vad(self) -> None:
        """The input buffer was committed or cleared: positions count from zero again."""
        if self.vad is not None:
            self.vad.reset()

    def track(self, item_id: str, transcription: asyncio.Task) -> None:
        self.transcriptions[item_id] = transcription
        transcription.add_done_callback(lambda _: self.transcriptions.pop(item_id, None))

    async def transcribed(self) -> None:
        """Wait for the transcriptions running now (failed ones included)."""
        if self.transcriptions:
            await asyncio.gather(*list(self.transcriptions.values()), return_exceptions=True)

    def close(self) -> None:
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

"""`TurnState`: a session's server VAD runs on the event loop, a slice of audio at a time."""

from __future__ import annotations

import asyncio

import numpy as np

from streamvox.agent.turn_state import TurnState
from streamvox.agent.vad import SileroModel, VadSettings
from tests.agent.test_vad import RATE, events_of, speech


def test_a_long_append_is_heard_a_slice_at_a_time(espeak_server):
    """A minute of audio in one append: the loop turns between slices (other sessions' events wait for no more
    than one slice), and the events are those of the whole audio heard at once."""
    turn = np.concatenate([np.zeros(RATE, np.float32), speech(espeak_server, "Hello there, how are you today?")])
    audio = np.concatenate([turn] * -(-60 * RATE // len(turn)) + [np.zeros(RATE, np.float32)])

    SileroModel.shared()  # loaded: hearing is all the listening task does

    async def run() -> tuple[list, int]:
        turns, heard, ticks = TurnState(), [], 0

        async def on_event(event) -> None:
            heard.append((event.kind, event.ms))

        async def ticking() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(ticking())
        await asyncio.sleep(0)
        turns.listen(turns.vad_for(VadSettings(), RATE, 0), audio, on_event)
        await turns.listening
        ticker.cancel()
        return heard, ticks

    heard, ticks = asyncio.run(run())
    assert heard == [(e.kind, e.ms) for e in events_of(audio, VadSettings(), chunk_ms=len(audio) * 1000 // RATE)]
    assert len(heard) > 20 and ticks >= len(audio) // RATE - 1

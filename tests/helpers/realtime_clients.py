"""Plain WebSocket clients for the realtime protocols, and solo reference audio to compare against."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import websockets

DELTA_TYPES = {"response.output_audio.delta", "response.audio.delta"}


def reference_pcm(server, text: str, voice: str, sample_rate: int = 24000) -> bytes:
    """What `text` gives alone: the non-streaming /v1/audio/speech clip as s16le PCM."""
    response = httpx.post(f"{server.url}/v1/audio/speech", headers=server.headers(), timeout=60,
                          json={"input": text, "voice": voice, "response_format": "pcm", "sample_rate": sample_rate})
    response.raise_for_status()
    return response.content


class RealtimeClient:
    """A raw `/v1/realtime` connection: send events, read JSON events (with a timeout)."""

    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self.session: dict | None = None

    @classmethod
    async def connect(cls, server, *, beta: bool = False, **kwargs) -> RealtimeClient:
        headers = dict(server.headers())
        if beta:
            headers["OpenAI-Beta"] = "realtime=v1"
        ws = await websockets.connect(f"{server.ws_url}/v1/realtime?model=espeak", additional_headers=headers,
                                      max_size=None, **kwargs)
        client = cls(ws)
        created = await client.recv()
        assert created["type"] == "session.created", created
        client.session = created["session"]
        return client

    async def send(self, event: dict) -> None:
        await self.ws.send(json.dumps(event))

    async def recv(self, timeout: float = 20.0) -> dict:
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout))

    async def expect(self, event_type: str, timeout: float = 20.0) -> dict:
        event = await self.recv(timeout)
        assert event["type"] == event_type, event
        return event

    async def until(self, event_type: str, timeout: float = 60.0) -> list[dict]:
        """Every event up to and including the first `event_type`."""
        events = []
        while True:
            event = await self.recv(timeout)
            events.append(event)
            if event["type"] == event_type:
                return events

    async def say(self, text: str, **response) -> list[dict]:
        """A user text item then `response.create`; the events up to `response.done`."""
        await self.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
        await self.send({"type": "response.create", **({"response": response} if response else {})})
        return await self.until("response.done")

    async def close(self) -> None:
        await self.ws.close()


def audio_of(events: list[dict]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] in DELTA_TYPES)


def answered(response: dict) -> bool:
    """The reply ran to its end: the LLM's end of turn (completed), or its token limit (incomplete, as upstream
    says; a random tiny LLM seldom ends a turn by itself)."""
    details = response["status_details"] or {}
    return response["status"] == "completed" or (response["status"], details.get("type"), details.get("reason")) \
        == ("incomplete", "incomplete", "max_output_tokens")

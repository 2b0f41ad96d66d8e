"""Messages between the front end (server process) and the engine core process.

Each ZMQ message is a multipart message: frame 0 is a msgspec-msgpack encoded
struct below; an `Outputs` carries its PCM as further raw frames
(little-endian float32), never as JSON or base64.
"""

from __future__ import annotations

import msgspec

from streamvox.contract import ModelInfo, SpeechRequest, WordTimings

# front end -> core


class AddRequest(msgspec.Struct, tag=True):
    request: SpeechRequest


class FeedText(msgspec.Struct, tag=True):
    request_id: str
    text: str


class EndInput(msgspec.Struct, tag=True):
    request_id: str


class Cancel(msgspec.Struct, tag=True):
    request_id: str


class Shutdown(msgspec.Struct, tag=True):
    pass


class AddVoice(msgspec.Struct, tag=True):
    """Register a cloned voice; the core answers with `VoiceResult(token)`."""

    token: int
    name: str
    pcm: bytes  # mono float32 PCM at `sample_rate`
    sample_rate: int
    ref_text: str | None = None


class RemoveVoice(msgspec.Struct, tag=True):
    name: str


CoreInput = AddRequest | FeedText | EndInput | Cancel | Shutdown | AddVoice | RemoveVoice

# core -> front end


class Ready(msgspec.Struct, tag=True):
    info: ModelInfo


class Outputs(msgspec.Struct, tag=True):
    """One engine step's results, in one ZMQ message: a raw float32 PCM frame follows per id in `audio`,
    at that request's output rate.

    The front end applies `audio` first, then `words`, then `ended`: a request's timings follow the audio
    they cover (`word_gate.WordGate`), and its last audio and timings precede its end.
    """

    audio: list[str]
    ended: list[Finished | Failed] = []
    words: list[RequestWords] = []


class RequestWords(msgspec.Struct):
    """Word timings of one request (only ever inside `Outputs.words`)."""

    request_id: str
    timings: WordTimings


class Finished(msgspec.Struct, tag=True):
    """A request ended normally (only ever inside `Outputs.ended`)."""

    request_id: str
    reason: str  # "stop" | "length" | "cancelled"
    input_tokens: int = 0
    output_tokens: int = 0


class Failed(msgspec.Struct, tag=True):
    """A request failed (only ever inside `Outputs.ended`)."""

    request_id: str
    message: str
    code: str = "invalid_request"
    param: str | None = None


class VoiceResult(msgspec.Struct, tag=True):
    """Outcome of `AddVoice`: `message` is None on success, else why the voice was refused."""

    token: int
    name: str
    message: str | None = None
    code: str = "invalid_request"
    param: str | None = None


class CoreCrashed(msgspec.Struct, tag=True):
    """The core is about to exit after an unexpected error."""

    message: str


CoreOutput = Ready | Outputs | VoiceResult | CoreCrashed

input_encoder = msgspec.msgpack.Encoder()
input_decoder = msgspec.msgpack.Decoder(CoreInput)
output_encoder = msgspec.msgpack.Encoder()
output_decoder = msgspec.msgpack.Decoder(CoreOutput)

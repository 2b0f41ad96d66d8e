"""From buffered codec frames to PCM on the sink: chunking, batched codec decoder calls and, on CUDA, the
asynchronous device-to-host pipeline.

A request's frames go to the streaming codec decoder in chunks: the first of `initial_codec_chunk_frames` or
1 frame, then doubling up to `codec_chunk_frames`, the chunks of every request that has one due batched into
one decoder call. On CUDA the decoder is a `codec/graphed.GraphedDecoder` (graphs per (rows, frames) bucket,
carried state in slot buffers): first chunks decode on the AR stream, which has high priority, and later
chunks on a low-priority decoder stream; PCM reaches pinned memory asynchronously, so decoding overlaps the
next AR steps, and each call's audio is sent once its event has completed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch

from streamvox.contract import OutputSink
from streamvox.models.qwen3_tts.codec.code2wav import Code2Wav
from streamvox.models.qwen3_tts.codec.graphed import GraphedDecoder
from streamvox.models.qwen3_tts.runtime.requests import Request
from streamvox.models.qwen3_tts.runtime.timing import StepTiming, time_gpu

POLL_INTERVAL_S = 2e-4  # while waiting for the GPU with decoder calls in flight
BLOCK_MAX_S = 1e-3  # with nothing but decoder calls in flight, the longest wait before the engine looks for requests


class StreamingCodec(Protocol):
    """What the runner needs from the codec decoder (the speech tokenizer's code2wav)."""

    @property
    def sample_rate(self) -> int: ...

    @property
    def samples_per_frame(self) -> int: ...

    def new_stream_state(self) -> Any: ...

    def decode_stream(self, codes_list: list[torch.Tensor], states: list[Any]) -> list[torch.Tensor]:
        """codes_list[i]: `[G, t_i]` next frames of request i; returns its new samples `[t_i * spf]`."""
        ...

    def release_stream(self, state: Any) -> None:
        """The request is gone: free what its state holds."""
        ...


class DecodePipeline:
    """The codec side of the runner. `codec_graphs` ("0", "1", "auto": `Qwen3Settings.codec_graphs`) decides
    whether a `Code2Wav` is served as a `GraphedDecoder`; `dec_stream` is the low-priority decoder stream, given
    on CUDA only; `requests` is the runner's live request table (audio of a request released meanwhile is
    dropped)."""

    def __init__(self, codec: StreamingCodec | None, requests: Mapping[str, Request], codec_chunk_frames: int,
                 max_batch: int, codec_graphs: str, dec_stream: torch.cuda.Stream | None,
                 timing: StepTiming | None) -> None:
        cuda = dec_stream is not None
        if isinstance(codec, Code2Wav) and (codec_graphs == "1" or (codec_graphs == "auto" and cuda)):
            lanes = (min(2, codec_chunk_frames), codec_chunk_frames)  # first chunks; the rest
            codec = GraphedDecoder(codec, slots=2 * max_batch, max_rows=max_batch, lane_frames=lanes)
            codec.warmup()
        elif cuda and isinstance(codec, Code2Wav):
            codec.check_codes = False  # our codes come from the model's heads: always in range (no host sync)
        self.codec = codec
        if timing is not None and isinstance(codec, GraphedDecoder):
            timing.notes.append(codec.usage)
        self.requests = requests
        self.codec_chunk_frames = codec_chunk_frames
        self.dec_stream = dec_stream
        self.timing = timing
        # decoder calls whose audio has not been sent: (done event, pinned PCM, [(request, offset, samples)])
        self.inflight: list[tuple[Any, torch.Tensor, list[tuple[Request, int, int]]]] = []

    def _first_chunk(self, req: Request) -> int:
        if req.initial_chunk is not None:
            return req.initial_chunk
        # One frame, for latency; the chunks after it double (see `_chunk_size`), so the number of decoder
        # calls per request stays small.
        return 1

    def _chunk_size(self, req: Request) -> int:
        """Frames in the request's next chunk: the first chunk, then doubling up to `codec_chunk_frames`
        (e.g. 1, 2, 4, 8, 16, 25, 25, ...). Each chunk's audio lasts as long as the time to generate
        the next at >= 2x real time, so playback never waits for a chunk once it has started."""
        if req.chunks == 0:
            return self._first_chunk(req)
        return min(self.codec_chunk_frames, req.first_chunk << min(req.chunks, 16))

    def chunk_due(self, req: Request) -> bool:
        if req.finish_reason is not None:
            return True
        return len(req.buffer) >= self._chunk_size(req)

    def emit(self, requests: list[Request], sink: OutputSink, block: bool = False) -> None:
        """Decode the due chunks of `requests` (in admission order) and send the audio of every decoder call
        that has finished (`block`, with no chunk due: wait a little for one, see `poll`)."""
        due = [r for r in requests if (r.buffer and self.chunk_due(r))]
        if due and isinstance(self.codec, GraphedDecoder) and self.dec_stream is not None:
            # first chunks: lane 0 on the AR stream (high priority); the rest: lane 1 on the decoder stream
            small = self.codec.lane_frames(0)
            first = [r for r in due if r.codec_state is None and r.spec.ref_codes is None and len(r.buffer) <= small]
            if first:
                self._decode_async(first, None, lane=0)
            rest = [r for r in due if r not in first]
            if rest:
                self._decode_async(rest, self.dec_stream, lane=1)
        elif due and self.codec is not None and self.dec_stream is not None:
            self._decode_async(due, self.dec_stream)
        elif due and self.codec is not None:
            for req, piece in zip(due, self._decode_chunks(due), strict=True):
                pcm = piece.float().cpu().numpy()
                if pcm.size:
                    self._send_audio(sink, req, pcm)
        for req in due:
            if req.chunks == 0:
                req.first_chunk = len(req.buffer)
            req.buffer.clear()
            req.chunks += 1
        self.poll(sink, block and not due)

    def _decode_chunks(self, due: list[Request], **lane: int) -> list[torch.Tensor]:
        """Decode the buffered frames of the due requests in one batched codec call; returns each one's new PCM.

        A request's first call primes the decoder with its reference frames (if any) as left context;
        their audio is dropped here."""
        assert self.codec is not None
        codes_list, states, drop = [], [], []
        for req in due:
            codes = torch.stack(req.buffer, dim=1)  # [G, t]
            skip = 0
            if req.codec_state is None:
                req.codec_state = self.codec.new_stream_state()
                if req.spec.ref_codes is not None:
                    ref = req.spec.ref_codes.t().to(codes.device)
                    codes = torch.cat([ref, codes], dim=1)
                    skip = ref.shape[1] * self.codec.samples_per_frame
            codes_list.append(codes)
            states.append(req.codec_state)
            drop.append(skip)
        outs = self.codec.decode_stream(codes_list, states, **lane)
        return [pcm[skip:] for pcm, skip in zip(outs, drop, strict=True)]

    def _decode_async(self, due: list[Request], stream: torch.cuda.Stream | None, **lane: int) -> None:
        """Decode the due chunks on `stream` (None: the current one); their PCM reaches pinned memory
        asynchronously."""
        assert self.codec is not None
        ds = stream or torch.cuda.current_stream()
        ds.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(ds):
            span = time_gpu(self.timing, f"decoder_lane{lane.get('lane', 1)}", ds)
            pieces = self._decode_chunks(due, **lane)
            span()
            flat = torch.cat(pieces).float() if pieces else torch.zeros(0, device=ds.device)
            host = torch.empty(flat.shape, dtype=torch.float32, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record(ds)
        spans, off = [], 0
        for req, piece in zip(due, pieces, strict=True):
            n = piece.shape[0]
            spans.append((req, off, n))
            off += n
            req.inflight += 1
        self.inflight.append((event, host, spans))

    def poll(self, sink: OutputSink, block: bool) -> None:
        """Send the audio of every finished decoder call, oldest first (`block`: if none has finished,
        wait a little for one; never long, so the engine keeps admitting new requests while a long
        decoder call runs). Calls finish out of order only across streams: a first chunk on the AR stream
        may overtake older calls on the decoder stream. A call waits while an older one of the same request
        does, so each request's audio goes out in order."""
        if block and self.inflight:
            deadline = time.perf_counter() + BLOCK_MAX_S
            while not any(e.query() for e, _, _ in self.inflight) and time.perf_counter() < deadline:
                time.sleep(POLL_INTERVAL_S)
        waiting, held = [], set()  # held: requests with an older call still running
        for event, host, spans in self.inflight:
            if not event.query() or any(req.rid in held for req, _, _ in spans):
                waiting.append((event, host, spans))
                held.update(req.rid for req, _, _ in spans)
                continue
            pcm = host.numpy()
            for req, off, n in spans:
                req.inflight -= 1
                if n and self.requests.get(req.rid) is req:
                    self._send_audio(sink, req, pcm[off : off + n].copy())
        self.inflight = waiting

    def _send_audio(self, sink: OutputSink, req: Request, pcm: np.ndarray) -> None:
        if not req.audio_sent and self.timing is not None:
            self.timing.latency["first_audio"].append(time.perf_counter() - req.created)
        req.audio_sent = True
        sink.audio(req.rid, pcm)

    def release(self, req: Request) -> None:
        """Free the request's decoder state."""
        if req.codec_state is not None and self.codec is not None:
            self.codec.release_stream(req.codec_state)
        req.codec_state = None

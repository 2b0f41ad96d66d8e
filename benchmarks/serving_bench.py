"""Serving benchmark for `POST /v1/audio/speech`: TTFP, E2E, RTF and audio throughput.

Formulas (as in the upstream Qwen3-TTS serving benchmark):
  TTFP = time to the first non-empty audio chunk; E2E = time to the last byte;
  RTF = E2E / audio duration; throughput = total audio seconds / wall time.
Also per request: stall = how long a real-time player that starts at the first audio would
have waited, in all, for audio that had not arrived yet (`Playback`).

Starts its own `streamvox serve` unless --url is given. Example:
  python benchmarks/serving_bench.py --model espeak --stream-format sse --concurrency 1 4 16 64

The default client (`--client raw`) speaks HTTP/1.1 over plain asyncio streams,
one keep-alive connection per worker, because on a small machine httpx's own
CPU cost competes with the server it measures; `--client httpx` keeps the
httpx client for comparison. Both time the same events. When the benchmark
starts the server itself it also reports the CPU time (user + system) that the
client, the server process (event loop), the engine core and the synthesis
processes spent per second of audio.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
import msgspec
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.helpers.server import start_server  # noqa: E402

TEXTS = [
    "The quick brown fox jumps over the lazy dog, then rests beneath a tall oak tree near the river.",
    "Real-time speech needs a short time to the first packet and no gaps while it plays.",
    "Every request keeps its own state, so concurrent streams never bleed into each other.",
    "A voice agent listens, thinks and speaks, and the speaking should start right away.",
]


class Playback:
    """A player that starts with a request's first audio and plays in real time: `stall` is how long, in
    all, it would have waited for audio that had not arrived yet (s16le mono: 2 bytes a sample)."""

    def __init__(self, sample_rate: int) -> None:
        self.bytes_per_s = 2 * sample_rate
        self.until: float | None = None  # when the audio received so far runs out
        self.stall = 0.0
        self.last = 0.0  # when the last audio arrived

    def add(self, now: float, nbytes: int) -> None:
        if not nbytes:
            return
        self.last = now
        if self.until is None:
            self.until = now
        elif now > self.until:
            self.stall += now - self.until
            self.until = now
        self.until += nbytes / self.bytes_per_s


def _timings(start: float, ttfp: float | None, playback: Playback, pcm_bytes: int, sample_rate: int) -> dict:
    """One request's TTFP, E2E (now), audio seconds (s16le mono), RTF, playback stall, and tail: how long its
    end came after its last audio (what waiting for its last word timings adds); `rtf_audio` is the RTF up to
    its last audio, without the tail."""
    now = time.perf_counter()
    e2e = now - start
    audio_s = pcm_bytes / 2 / sample_rate
    last = playback.last or now
    return {"ttfp": ttfp, "e2e": e2e, "audio_s": audio_s, "rtf": e2e / audio_s if audio_s else float("inf"),
            "rtf_audio": (last - start) / audio_s if audio_s else float("inf"),
            "stall": playback.stall, "tail": now - last}


async def one_request(client: httpx.AsyncClient, body: dict, sse: bool, sample_rate: int) -> dict:
    start = time.perf_counter()
    ttfp = None
    pcm_bytes = 0
    playback = Playback(sample_rate)
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        if sse:
            buffer = b""
            async for chunk in response.aiter_bytes():
                buffer += chunk
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    payload = json.loads(event.removeprefix(b"data: "))
                    if payload["type"] == "speech.audio.delta":
                        size = len(base64.b64decode(payload["audio"]))
                        if size and ttfp is None:
                            ttfp = time.perf_counter() - start
                        playback.add(time.perf_counter(), size)
                        pcm_bytes += size
        else:
            async for chunk in response.aiter_bytes():
                if chunk and ttfp is None:
                    ttfp = time.perf_counter() - start
                playback.add(time.perf_counter(), len(chunk))
                pcm_bytes += len(chunk)
    return _timings(start, ttfp, playback, pcm_bytes, sample_rate)


class _SSEEvent(msgspec.Struct):
    type: str
    audio: str = ""


_sse_decoder = msgspec.json.Decoder(_SSEEvent)


def _b64_size(text: str) -> int:
    """Decoded size of base64 text, without decoding it."""
    return len(text) * 3 // 4 - text.count("=", -2)


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client connection on asyncio streams (chunked or sized bodies)."""

    def __init__(self, url: str, headers: dict) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, AsyncIterator[bytes]]:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"{method} {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n{self.extra}"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n")
        self.writer.write(head.encode() + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if headers.get("connection", "").lower() == "close":
            self.writer = None
        return status, self._body(headers)

    async def _body(self, headers: dict) -> AsyncIterator[bytes]:
        reader = self.reader
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        else:
            length = int(headers.get("content-length", "0"))
            if length:
                yield await reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def one_request_raw(connection: RawConnection, body: dict, sse: bool, sample_rate: int) -> dict:
    """The same timings as `one_request`, over a `RawConnection`."""
    start = time.perf_counter()
    ttfp = None
    pcm_bytes = 0
    playback = Playback(sample_rate)
    status, chunks = await connection.request("POST", "/v1/audio/speech", msgspec.json.encode(body))
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {b''.join([c async for c in chunks])[:300]!r}")
    buffer = b""
    timed = 0
    async for chunk in chunks:
        if sse:
            buffer += chunk
            *events, buffer = buffer.split(b"\n\n")
            for event in events:
                payload = _sse_decoder.decode(event[6:] if event.startswith(b"data: ") else event)
                timed += payload.type == "speech.audio.timestamps"
                if payload.type == "speech.audio.delta":
                    size = _b64_size(payload.audio)
                    if size and ttfp is None:
                        ttfp = time.perf_counter() - start
                    playback.add(time.perf_counter(), size)
                    pcm_bytes += size
        else:
            if chunk and ttfp is None:
                ttfp = time.perf_counter() - start
            playback.add(time.perf_counter(), len(chunk))
            pcm_bytes += len(chunk)
    return {**_timings(start, ttfp, playback, pcm_bytes, sample_rate), "timestamp_events": timed}


async def run_level(url: str, concurrency: int, num_requests: int, args) -> dict:
    if args.client == "raw":
        return await _run_level(concurrency, num_requests, args, _raw_worker_factory(url, args))
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits, headers=_headers(args)) as client:
        async def send(body: dict) -> dict:
            return await one_request(client, body, args.stream_format == "sse", args.sample_rate)

        return await _run_level(concurrency, num_requests, args, lambda: send)


def _raw_worker_factory(url: str, args):
    def new_worker():
        connection = RawConnection(url, _headers(args))

        async def send(body: dict) -> dict:
            return await one_request_raw(connection, body, args.stream_format == "sse", args.sample_rate)

        return send

    return new_worker


async def _run_level(concurrency: int, num_requests: int, args, new_sender) -> dict:
    """Run `num_requests` requests, `concurrency` at a time, each worker with its own sender (connection)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(min(concurrency, 4)):
        queue.put_nowait(i)
    results = []
    senders = [new_sender() for _ in range(concurrency)]

    async def worker(send) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            results.append(await send(_body(args, i)))

    await asyncio.gather(*(worker(send) for send in senders[:4]))  # warm-up (a few requests), not counted
    for i in range(num_requests):
        queue.put_nowait(i)
    results.clear()
    cpu_start = cpu_times(args)
    wall_start = time.perf_counter()
    await asyncio.gather(*(worker(send) for send in senders))
    wall = time.perf_counter() - wall_start
    cpu = {name: value - cpu_start[name] for name, value in cpu_times(args).items()}
    ttfp = np.array([r["ttfp"] for r in results]) * 1000
    e2e = np.array([r["e2e"] for r in results]) * 1000
    rtf = np.array([r["rtf"] for r in results])
    stall = np.array([r["stall"] for r in results]) * 1000
    audio = sum(r["audio_s"] for r in results)
    row = {"concurrency": concurrency, "requests": len(results)}
    for name, values in (("ttfp_ms", ttfp), ("e2e_ms", e2e), ("rtf", rtf), ("stall_ms", stall)):
        for q in (50, 95, 99):
            row[f"{name}_p{q}"] = float(np.percentile(values, q))
    row["audio_s_per_s"] = audio / wall
    row["mean_audio_s"] = audio / len(results)
    for name, seconds in cpu.items():
        row[f"cpu_ms_per_audio_s_{name}"] = seconds / audio * 1000
    return row


def cpu_times(args) -> dict[str, float]:
    """CPU seconds (user + system) so far: this client, and when known the server, core and synthesis."""
    times = os.times()
    result = {"client": times.user + times.system}
    pid = getattr(args, "server_pid", None)
    if pid is None:
        return result
    tick = os.sysconf("SC_CLK_TCK")

    def stat(p: int) -> list[str]:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()

    try:
        result["server"] = (int(stat(pid)[11]) + int(stat(pid)[12])) / tick
        core = args.core_pid
        fields = stat(core)
        result["core"] = (int(fields[11]) + int(fields[12])) / tick
        # Everything below the core (eSpeak's fork server and synthesis processes): what its processes
        # have reaped, plus the processes still running with what they have reaped.
        children = (int(fields[13]) + int(fields[14])) / tick

        def descendants(p: int) -> list[int]:
            try:
                with open(f"/proc/{p}/task/{p}/children") as f:
                    pids = [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                return []
            return pids + [d for child in pids for d in descendants(child)]

        for child in descendants(core):
            try:
                child_fields = stat(child)
                children += sum(int(child_fields[i]) for i in (11, 12, 13, 14)) / tick
            except (OSError, ValueError):
                pass
        result["synthesis"] = children
    except (OSError, ValueError, IndexError):
        pass
    return result


def _headers(args) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def _body(args, i: int) -> dict:
    body = {"model": args.model_name, "input": args.text or TEXTS[i % len(TEXTS)], "response_format": "pcm",
            "stream_format": args.stream_format, "sample_rate": args.sample_rate}
    body.update(json.loads(args.extra_body))
    return body


async def loop_lag_under_load(url: str, streams: int, args) -> dict:
    """Run `streams` concurrent streams and read the server's event-loop lag p99 while they run.

    The p99 the server exports covers its last 1000 lag samples (about 10 s); it is read every 0.5 s
    from the first response onwards, over a new connection each time (an idle keep-alive connection
    can be closed by the server just as the next request goes out). The lag histogram's counts between
    the first and the last read give the whole run's share of samples at or under 5 ms (a bucket bound):
    the run's p99 is <= 5 ms exactly when that share is >= 0.99.
    """
    lag_samples = []
    histograms = []  # (samples <= 5 ms, all samples) at each read
    text = " ".join(TEXTS * 3)
    body = {**_body(args, 0), "input": text}
    sse = args.stream_format == "sse"
    if args.client == "raw":
        connections = [RawConnection(url, _headers(args)) for _ in range(streams)]
        tasks = [asyncio.create_task(one_request_raw(c, body, sse, args.sample_rate)) for c in connections]
    else:
        client = httpx.AsyncClient(base_url=url, timeout=600, headers=_headers(args),
                                   limits=httpx.Limits(max_connections=streams + 8))
        tasks = [asyncio.create_task(one_request(client, body, sse, args.sample_rate)) for _ in range(streams)]
    cpu_start = cpu_times(args)
    wall_start = time.perf_counter()
    try:
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0.5)
            probe = RawConnection(url, _headers(args))
            try:
                status, chunks = await probe.request("GET", "/metrics")
                metrics = b"".join([c async for c in chunks]).decode()
            finally:
                probe.close()
            counts = {}
            for line in metrics.splitlines():
                if line.startswith("streamvox_event_loop_lag_p99_seconds "):
                    lag_samples.append(float(line.split()[1]) * 1000)
                elif line.startswith(('streamvox_event_loop_lag_seconds_bucket{le="0.005"}',
                                      "streamvox_event_loop_lag_seconds_count")):
                    counts[line.split()[0]] = float(line.split()[1])
            if len(counts) == 2:
                histograms.append(tuple(counts[k] for k in sorted(counts, key=lambda k: "count" in k)))
        results = await asyncio.gather(*tasks)
    finally:
        if args.client != "raw":
            await client.aclose()
    wall = time.perf_counter() - wall_start
    cpu = {name: value - cpu_start[name] for name, value in cpu_times(args).items()}
    audio = sum(r["audio_s"] for r in results)
    share = None
    if len(histograms) >= 2 and histograms[-1][1] > histograms[0][1]:
        share = (histograms[-1][0] - histograms[0][0]) / (histograms[-1][1] - histograms[0][1])
    row = {"streams": streams, "loop_lag_share_le_5ms": share,
           "loop_lag_samples": histograms[-1][1] - histograms[0][1] if len(histograms) >= 2 else 0,
           "loop_lag_p99_ms_max": max(lag_samples) if lag_samples else None,
           "loop_lag_p99_ms_median": float(np.median(lag_samples)) if lag_samples else None,
           "lag_reads": len(lag_samples), "wall_s": wall, "audio_s_per_s": audio / wall,
           "ttfp_ms_p50": float(np.percentile([r["ttfp"] for r in results], 50)) * 1000,
           "ttfp_ms_p95": float(np.percentile([r["ttfp"] for r in results], 95)) * 1000}
    for name, seconds in cpu.items():
        row[f"cpu_ms_per_audio_s_{name}"] = seconds / audio * 1000
    return row


def hardware() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return f"{os.cpu_count()} x {cpu}" + (f"; GPU: {gpu}" if gpu else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an already running server; otherwise one is started")
    parser.add_argument("--model", default="espeak", help="--model for the server this starts")
    parser.add_argument("--model-name", default=None, help="'model' field (default: the served model)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--stream-format", choices=("sse", "audio"), default="sse")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests-per-level", type=int, default=0, help="default: max(16, 4 x concurrency)")
    parser.add_argument("--sample-rate", type=int, default=24000)
    parser.add_argument("--text", default=None, help="one text for every request")
    parser.add_argument("--extra-body", default="{}", help="JSON merged into every request body")
    parser.add_argument("--lag-streams", type=int, default=200, help="0 to skip the event-loop lag run")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw", help="HTTP client (see above)")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    server = None if args.url else start_server("--model", args.model)
    url = args.url or server.url
    if server is not None:
        args.server_pid = server.process.pid
        args.core_pid = httpx.get(f"{url}/health", headers=_headers(args)).json()["engine_pid"]
    args.model_name = args.model_name or httpx.get(f"{url}/v1/models", headers=_headers(args)).json()["data"][0]["id"]
    print(f"# command: {' '.join(sys.argv)}")
    print(f"# hardware: {hardware()}; load average before start: {os.getloadavg()[0]:.2f}")
    try:
        rows = []
        for concurrency in args.concurrency:
            n = args.requests_per_level or max(16, 4 * concurrency)
            row = asyncio.run(run_level(url, concurrency, n, args))
            rows.append(row)
            print(json.dumps(row), flush=True)
        lag = asyncio.run(loop_lag_under_load(url, args.lag_streams, args)) if args.lag_streams else None
        if lag:
            print(json.dumps(lag), flush=True)
    finally:
        if server:
            server.stop()
    print("\n| concurrency | TTFP p50 ms | TTFP p95 ms | TTFP p99 ms | E2E p50 ms | E2E p95 ms | RTF p50 | RTF p95 "
          "| audio s/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['ttfp_ms_p50']:.1f} | {r['ttfp_ms_p95']:.1f} | {r['ttfp_ms_p99']:.1f} "
              f"| {r['e2e_ms_p50']:.1f} | {r['e2e_ms_p95']:.1f} | {r['rtf_p50']:.4f} | {r['rtf_p95']:.4f} "
              f"| {r['audio_s_per_s']:.1f} |")
    cpu_rows = [r for r in [*rows, lag] if r and "cpu_ms_per_audio_s_server" in r]
    if cpu_rows:
        print("\nCPU ms per audio second (user + system)\n")
        print("| run | client | server (event loop) | engine core | synthesis |")
        print("|---|---|---|---|---|")
        for r in cpu_rows:
            name = f"c={r['concurrency']}" if "concurrency" in r else f"{r['streams']} streams"
            print(f"| {name} | {r['cpu_ms_per_audio_s_client']:.2f} | {r['cpu_ms_per_audio_s_server']:.2f} "
                  f"| {r.get('cpu_ms_per_audio_s_core', float('nan')):.2f} "
                  f"| {r.get('cpu_ms_per_audio_s_synthesis', float('nan')):.2f} |")
    if lag:
        share = lag["loop_lag_share_le_5ms"]
        whole = "n/a" if share is None else (f"{100 * share:.2f}% of {lag['loop_lag_samples']:.0f} samples <= 5 ms, "
                                             f"so the run's p99 is {'<=' if share >= 0.99 else '>'} 5 ms")
        print(f"\nEvent-loop lag p99 while {lag['streams']} streams run: median of {lag['lag_reads']} reads "
              f"{lag['loop_lag_p99_ms_median']:.1f} ms, max {lag['loop_lag_p99_ms_max']:.1f} ms; whole run: {whole}; "
              f"TTFP p50 {lag['ttfp_ms_p50']:.0f} ms, p95 {lag['ttfp_ms_p95']:.0f} ms; "
              f"{lag['audio_s_per_s']:.1f} audio s/s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "hardware": hardware(), "rows": rows, "lag": lag}, f, indent=1)


if __name__ == "__main__":
    main()

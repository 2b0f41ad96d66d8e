"""Open-loop serving benchmark for `POST /v1/audio/speech`: Poisson arrivals at fixed rates.

A closed-loop benchmark (N workers, each waiting for its last response) sends less when the server slows
down, so it hides queueing. Real users do not wait for each other: here every request is launched at its
Poisson arrival time whatever the earlier ones are doing, and each rate runs for a fixed time.

Per rate, over the requests that arrive after the warm-up:
  audible TTFA = scheduled arrival -> first received sample above -40 dBFS (|s| > 0.01 full scale);
    the clock starts at the scheduled time, not when this client got round to sending, so a lagging
    client cannot hide latency (the lag itself is reported as send_lag_ms_p99);
  E2E = scheduled arrival -> last byte;
  underruns = chunks that arrive after a player, started `--jitter-buffer-ms` after the first audio byte,
    has played everything received before them; stall = the sum of those gaps;
  achieved rate and audio seconds per wall second, over max(duration, measured window start -> last reply).
CPU: cores kept busy, per rate, by the server's process tree, by this client and by everything else (other
load: on a shared machine it competes with the server, so a run with much of it is not a clean figure).
The highest sustained rate is the highest rate with every request answered, 0 underruns and
p95 audible TTFA <= 200 ms. Starts its own `streamvox serve --model MODEL` unless --url is given. Example:
  python benchmarks/open_loop_bench.py --rates 1 2 4 6 8 10 --duration 30 --warmup 5

A random-weight checkpoint (make_real_shape_checkpoint.py) never chooses end-of-speech reliably:
--frames-per-word F gives each request `max_new_tokens` = F x its words, and the server it starts runs with
STREAMVOX_QWEN3_IGNORE_EOS=1, so every reply is as long as speech of its text would be (5 frames of the 12.5 Hz
codec a word is 0.4 s, about 150 words a minute). --temperature T is sent with every request; without it the
checkpoint's default applies, which for Qwen3-TTS samples (on a GPU sampled requests take the CUDA-graph fast path
as greedy ones do, with the noise drawn on the device: docs/gpu.md). Example on a GPU:
  python benchmarks/open_loop_bench.py --model /tmp/q17 --frames-per-word 5 --temperature 0 \
      --server-args "--max-batch 64" --startup-timeout 600 --rates 1 5 10 20 30 40 60 --duration 60 --warmup 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable, Sequence
from urllib.parse import urlsplit

import httpx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.conftest import start_server  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "corpus", "open_loop_en.txt")
BUCKETS = ((1, 5), (6, 15), (16, 30), (31, 60), (61, 100), (101, 10**9))  # words per text
AUDIBLE = 0.01  # -40 dBFS, as a fraction of full scale
TTFA_LIMIT_MS = 200.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank: the smallest observed value with at least q% of values at or below it, so a tail
    figure is always a latency that really happened (with under 100 samples p99 is the maximum)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


class PlaybackClock:
    """One stream's player: starts `jitter_s` after the first audio byte, then plays in real time.

    A chunk that arrives after everything received before it has been played is an underrun; the gap
    is stall time and playback resumes from that chunk. s16le mono: 2 bytes a sample."""

    def __init__(self, sample_rate: int, jitter_s: float) -> None:
        self.bytes_per_s = 2 * sample_rate
        self.jitter_s = jitter_s
        self.until: float | None = None  # when the audio received so far has been played
        self.underruns = 0
        self.stall = 0.0

    def add(self, now: float, nbytes: int) -> None:
        if not nbytes:
            return
        if self.until is None:
            self.until = now + self.jitter_s
        elif now > self.until:
            self.underruns += 1
            self.stall += now - self.until
            self.until = now
        self.until += nbytes / self.bytes_per_s


class AudibleDetector:
    """Finds the first s16le sample above `AUDIBLE`; chunks may split a sample, so an odd byte carries over."""

    def __init__(self) -> None:
        self.limit = AUDIBLE * 32768
        self.carry = b""
        self.found = False

    def feed(self, chunk: bytes) -> bool:
        if not self.found:
            data = self.carry + chunk
            cut = len(data) - len(data) % 2
            self.carry = data[cut:]
            samples = np.frombuffer(data[:cut], dtype="<i2").astype(np.int32)
            self.found = bool((np.abs(samples) > self.limit).any())
        return self.found


def poisson_arrivals(rate: float, span_s: float, rng: random.Random) -> list[float]:
    """Arrival offsets in [0, span_s): exponential gaps with mean 1/rate."""
    times, t = [], rng.expovariate(rate)
    while t < span_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def highest_sustained(rows: Iterable[dict], ttfa_limit_ms: float = TTFA_LIMIT_MS) -> float | None:
    """The highest rate whose requests all succeeded with 0 underruns and p95 audible TTFA within the limit."""
    passing = [r["rate"] for r in rows if r["failed"] == 0 and r["ok"] > 0 and r["underruns"] == 0
               and r["ttfa_ms_p95"] is not None and r["ttfa_ms_p95"] <= ttfa_limit_ms]
    return max(passing, default=None)


def length_cap(text: str, frames_per_word: float) -> int:
    """`max_new_tokens` for `text` at `frames_per_word` codec frames a word (at least one frame)."""
    return max(1, round(len(text.split()) * frames_per_word))


def request_body(base: dict, text: str, frames_per_word: float | None, temperature: float | None) -> bytes:
    """The JSON body of one request for `text`: `base`, its `max_new_tokens` cap (`frames_per_word`) and
    `temperature` (None: neither field, the server's defaults)."""
    body = {**base, "input": text}
    if frames_per_word:
        body["max_new_tokens"] = length_cap(text, frames_per_word)
    if temperature is not None:
        body["temperature"] = temperature
    return json.dumps(body).encode()


def load_corpus(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def _bucket(words: int) -> str:
    lo, hi = next((lo, hi) for lo, hi in BUCKETS if lo <= words <= hi)
    return f"{lo}-{hi}" if hi < BUCKETS[-1][1] else f">{lo - 1}"


def corpus_lengths(texts: Sequence[str]) -> dict:
    """Words per text: min/p50/p95/max and the count in each bucket."""
    words = [len(t.split()) for t in texts]
    counts = Counter(_bucket(n) for n in words)
    return {"texts": len(words), "words_min": min(words), "words_p50": percentile(words, 50),
            "words_p95": percentile(words, 95), "words_max": max(words),
            "buckets": {_bucket(lo): counts.get(_bucket(lo), 0) for lo, _ in BUCKETS}}


class Connection:
    """A minimal HTTP/1.1 keep-alive connection on asyncio streams: httpx's own CPU cost would compete
    with the server on a small machine."""

    def __init__(self, host: str, port: int, extra_headers: str) -> None:
        self.host, self.port, self.extra = host, port, extra_headers
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reusable = False

    async def post(self, path: str, body: bytes) -> tuple[int, dict, AsyncIterator[bytes]]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n{self.extra}content-type: "
                          f"application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        self.reusable = headers.get("connection", "").lower() != "close"
        return int(lines[0].split(" ", 2)[1]), headers, self._body(headers)

    async def _body(self, headers: dict) -> AsyncIterator[bytes]:
        if headers.get("transfer-encoding", "").lower() != "chunked":
            yield await self.reader.readexactly(int(headers.get("content-length", "0")))
            return
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            yield (await self.reader.readexactly(size + 2))[:-2]
        await self.reader.readuntil(b"\r\n")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class Pool:
    """Idle keep-alive connections; an arrival that finds none opens a new one (open loop never waits).

    A connection idle longer than `IDLE_S` is closed rather than reused: the server (uvicorn: 5 s) may be
    closing it just as the next request goes out, which would count as a failed request."""

    IDLE_S = 1.0

    def __init__(self, url: str, headers: dict) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.idle: deque[tuple[Connection, float]] = deque()  # oldest first

    def take(self) -> Connection:
        now = time.perf_counter()
        while self.idle and now - self.idle[0][1] > self.IDLE_S:
            self.idle.popleft()[0].close()
        return self.idle.pop()[0] if self.idle else Connection(self.host, self.port, self.extra)

    def give(self, connection: Connection) -> None:
        if connection.reusable:
            self.idle.append((connection, time.perf_counter()))
        else:
            connection.close()

    def close(self) -> None:
        while self.idle:
            self.idle.pop()[0].close()


async def one_request(pool: Pool, body: bytes, scheduled: float, sample_rate: int, args) -> dict:
    """Send one request at its arrival time and time its audio as it arrives (times from `scheduled`)."""
    connection = pool.take()
    result = {"send_lag": time.perf_counter() - scheduled, "ttfa": None, "ok": False, "error": None}
    playback, audible, nbytes = PlaybackClock(sample_rate, args.jitter_buffer_ms / 1000), AudibleDetector(), 0
    try:
        async with asyncio.timeout(args.timeout):
            status, headers, chunks = await connection.post("/v1/audio/speech", body)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {b''.join([c async for c in chunks])[:200]!r}")
            if int(headers.get("x-sample-rate", sample_rate)) != sample_rate:
                raise RuntimeError(f"server sent {headers['x-sample-rate']} Hz, expected {sample_rate}")
            async for chunk in chunks:
                now = time.perf_counter()
                playback.add(now, len(chunk))
                nbytes += len(chunk)
                if result["ttfa"] is None and audible.feed(chunk):
                    result["ttfa"] = now - scheduled
        pool.give(connection)
        result.update(ok=result["ttfa"] is not None, error=None if result["ttfa"] is not None else "no audible sample")
    except (OSError, RuntimeError, ValueError, TimeoutError, asyncio.IncompleteReadError) as error:
        connection.close()
        result["error"] = f"{type(error).__name__}: {str(error)[:200]}"
    done = time.perf_counter()
    result.update(e2e=done - scheduled, done=done, audio_s=nbytes / 2 / sample_rate, underruns=playback.underruns,
                  stall=playback.stall)
    return result


async def run_rate(rate: float, texts: Sequence[str], base: dict, args, sample_rate: int) -> dict:
    """Launch Poisson arrivals over warm-up + duration, wait for every reply, summarize the counted ones."""
    arrivals = poisson_arrivals(rate, args.warmup + args.duration, random.Random(f"{args.seed}:{rate}"))
    order = list(range(len(texts)))
    random.Random(args.seed).shuffle(order)
    pool = Pool(args.url, {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
    cpu_start, t0 = cpu_seconds(args.server_pid), time.perf_counter()
    tasks = []
    for i, offset in enumerate(arrivals):
        await asyncio.sleep(max(0.0, t0 + offset - time.perf_counter()))
        text = texts[order[i % len(order)]]
        body = request_body(base, text, args.frames_per_word, args.temperature)
        tasks.append((offset, asyncio.create_task(one_request(pool, body, t0 + offset, sample_rate, args))))
    results = [await task for offset, task in tasks if offset >= args.warmup]
    await asyncio.gather(*(task for _, task in tasks))
    wall = time.perf_counter() - t0
    cpu = {k: (v - cpu_start[k]) / wall for k, v in cpu_seconds(args.server_pid).items()}
    cpu["other"] = cpu["machine"] - cpu["client"] - cpu.get("server", 0.0)
    pool.close()
    return summarize(rate, results, args.duration, t0 + args.warmup, cpu)


def summarize(rate: float, results: Sequence[dict], duration: float, window_start: float, cpu: dict) -> dict:
    """One rate's row: latency percentiles in ms, underruns, stall, achieved rate and audio throughput."""
    ok = [r for r in results if r["ok"]]
    span = max([duration, *(r["done"] - window_start for r in results)])
    row = {"rate": rate, "sent": len(results), "ok": len(ok), "failed": len(results) - len(ok),
           "errors": dict(Counter(r.get("error") for r in results if not r["ok"]).most_common(3)),
           "achieved_rps": len(ok) / span, "audio_s_per_s": sum(r["audio_s"] for r in ok) / span,
           "underruns": sum(r["underruns"] for r in ok), "streams_with_underruns": sum(r["underruns"] > 0 for r in ok),
           "stall_ms": 1000 * sum(r["stall"] for r in ok)}
    for name in ("ttfa", "e2e", "send_lag"):
        for q in (50, 95, 99):
            value = percentile([r[name] for r in ok], q)
            row[f"{name}_ms_p{q}"] = None if value is None else 1000 * value
    row.update({f"cpu_{k}_cores": v for k, v in cpu.items()})
    return row


def cpu_seconds(server_pid: int | None) -> dict[str, float]:
    """CPU seconds (user + system) so far of the whole machine (all CPUs, steal excluded), of this client and,
    when known, of the server's process tree: what is left over is other load that competed with the run."""
    times, tick = os.times(), os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    result = {"machine": (user + nice + system + irq + softirq) / tick, "client": times.user + times.system}
    if server_pid is None:
        return result
    total, pending = 0, [server_pid]
    while pending:  # every live process with what it has reaped, so exited synthesis processes count once
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                total += sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:15])
            for thread in os.listdir(f"/proc/{pid}/task"):  # a child is listed under the thread that started it
                with open(f"/proc/{pid}/task/{thread}/children") as f:
                    pending += [int(child) for child in f.read().split()]
        except (OSError, ValueError):
            pass
    result["server"] = total / tick
    return result


def hardware() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    found = {"platform": platform.platform(), "cpu_model": cpu, "cpu_cores": os.cpu_count(),
             "python": platform.python_version()}
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        found["gpu"] = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return found


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_report(corpus: dict, rows: Sequence[dict], best: float | None) -> None:
    print(f"\nCorpus: {corpus['texts']} texts; words min {corpus['words_min']}, p50 {corpus['words_p50']}, "
          f"p95 {corpus['words_p95']}, max {corpus['words_max']}; per bucket: "
          + ", ".join(f"{k}: {v}" for k, v in corpus["buckets"].items()))
    print("\n| rate/s | sent | ok | achieved/s | TTFA p50 | TTFA p95 | TTFA p99 | E2E p50 | E2E p95 | E2E p99 "
          "| underruns | stall ms | audio s/s | send lag p99 | CPU cores: server | client | other load |")
    print("|" + "---|" * 17)
    for r in rows:
        print(f"| {r['rate']:g} | {r['sent']} | {r['ok']} | {r['achieved_rps']:.2f} | {_ms(r['ttfa_ms_p50'])} "
              f"| {_ms(r['ttfa_ms_p95'])} | {_ms(r['ttfa_ms_p99'])} | {_ms(r['e2e_ms_p50'])} | {_ms(r['e2e_ms_p95'])} "
              f"| {_ms(r['e2e_ms_p99'])} | {r['underruns']} | {r['stall_ms']:.0f} | {r['audio_s_per_s']:.1f} "
              f"| {_ms(r['send_lag_ms_p99'])} | {r.get('cpu_server_cores', float('nan')):.2f} "
              f"| {r['cpu_client_cores']:.2f} | {r['cpu_other_cores']:.2f} |")
    print(f"\nHighest sustained rate (all ok, 0 underruns, p95 audible TTFA <= {TTFA_LIMIT_MS:.0f} ms): "
          + (f"{best:g} requests/s" if best is not None else "none in this sweep"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="an already running server; otherwise one is started")
    parser.add_argument("--model", default="espeak", help="--model for the server this starts")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--voice", default="alloy")
    parser.add_argument("--rates", type=float, nargs="+", default=[1, 2, 4, 6, 8, 10], help="requests per second")
    parser.add_argument("--duration", type=float, default=30, help="counted seconds of arrivals per rate")
    parser.add_argument("--warmup", type=float, default=5, help="seconds of arrivals sent first, not counted")
    parser.add_argument("--jitter-buffer-ms", type=float, default=100)
    parser.add_argument("--timeout", type=float, default=120, help="seconds before a request counts as failed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", default=CORPUS)
    parser.add_argument("--out", default=None, help="JSON results file (e.g. benchmarks/results/x.json)")
    parser.add_argument("--frames-per-word", type=float, default=None,
                        help="cap each reply at this many codec frames a word, end-of-speech ignored (random weights)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sent with every request (0: greedy); default: the model's own (sampled)")
    parser.add_argument("--server-args", default="", help="more arguments for the server this starts, one string")
    parser.add_argument("--startup-timeout", type=float, default=120, help="seconds for the server to start")
    args = parser.parse_args()
    texts = load_corpus(args.corpus)
    corpus = corpus_lengths(texts)
    env = {"STREAMVOX_QWEN3_IGNORE_EOS": "1"} if args.frames_per_word else {}
    server = None if args.url else start_server("--model", args.model, *shlex.split(args.server_args), env=env,
                                                timeout=args.startup_timeout)
    args.url = args.url or server.url
    args.server_pid = server.process.pid if server else None
    command = shlex.join([sys.executable, *sys.argv])
    try:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = httpx.get(f"{args.url}/v1/models", headers=headers).json()["data"][0]
        sample_rate = int(model["sample_rate"])
        base = {"model": model["id"], "voice": args.voice, "response_format": "pcm", "stream_format": "audio",
                "sample_rate": sample_rate}  # ask for the model's own rate: the server's default may differ
        print(f"# command: {command}\n# hardware: {hardware()}\n# model {model['id']} at {sample_rate} Hz")
        rows = []
        for rate in args.rates:
            rows.append(asyncio.run(run_rate(rate, texts, base, args, sample_rate)))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if server:
            server.stop()
    best = highest_sustained(rows)
    print_report(corpus, rows, best)
    if args.out:
        settings = {k: getattr(args, k) for k in ("rates", "duration", "warmup", "jitter_buffer_ms", "timeout",
                                                  "seed", "voice", "frames_per_word", "temperature",
                                                  "server_args")}
        with open(args.out, "w") as f:
            json.dump({"command": command, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                       "hardware": hardware(), "model": model["id"], "sample_rate": sample_rate,
                       "settings": settings, "ttfa_limit_ms": TTFA_LIMIT_MS, "corpus": corpus,
                       "highest_sustained_rate": best, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

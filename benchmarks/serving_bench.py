"""Serving benchmark for `POST /v1/audio/speech`: TTFP, E2E, RTF and audio throughput.

Formulas (as in the upstream Qwen3-TTS serving benchmark):
  TTFP = time to the first non-empty audio chunk; E2E = time to the last byte;
  RTF = E2E / audio duration; throughput = total audio seconds / wall time.

Starts its own `streamvox serve` unless --url is given. Example:
  python benchmarks/serving_bench.py --model espeak --stream-format sse --concurrency 1 4 16 64
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

import httpx
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.conftest import start_server  # noqa: E402

TEXTS = [
    "The quick brown fox jumps over the lazy dog, then rests beneath a tall oak tree near the river.",
    "Real-time speech needs a short time to the first packet and no gaps while it plays.",
    "Every request keeps its own state, so concurrent streams never bleed into each other.",
    "A voice agent listens, thinks and speaks, and the speaking should start right away.",
]


async def one_request(client: httpx.AsyncClient, body: dict, sse: bool, sample_rate: int) -> dict:
    start = time.perf_counter()
    ttfp = None
    pcm_bytes = 0
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
                        pcm_bytes += size
        else:
            async for chunk in response.aiter_bytes():
                if chunk and ttfp is None:
                    ttfp = time.perf_counter() - start
                pcm_bytes += len(chunk)
    e2e = time.perf_counter() - start
    audio_s = pcm_bytes / 2 / sample_rate
    return {"ttfp": ttfp, "e2e": e2e, "audio_s": audio_s, "rtf": e2e / audio_s if audio_s else float("inf")}


async def run_level(url: str, concurrency: int, num_requests: int, args) -> dict:
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits, headers=_headers(args)) as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(num_requests):
            queue.put_nowait(i)
        results = []

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                results.append(await one_request(client, _body(args, i), args.stream_format == "sse", args.sample_rate))

        await asyncio.gather(*(worker() for _ in range(min(concurrency, 4))))  # warm-up, not counted
        for i in range(num_requests):
            queue.put_nowait(i)
        results.clear()
        wall_start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - wall_start
    ttfp = np.array([r["ttfp"] for r in results]) * 1000
    e2e = np.array([r["e2e"] for r in results]) * 1000
    rtf = np.array([r["rtf"] for r in results])
    audio = sum(r["audio_s"] for r in results)
    row = {"concurrency": concurrency, "requests": len(results)}
    for name, values in (("ttfp_ms", ttfp), ("e2e_ms", e2e), ("rtf", rtf)):
        for q in (50, 95, 99):
            row[f"{name}_p{q}"] = float(np.percentile(values, q))
    row["audio_s_per_s"] = audio / wall
    row["mean_audio_s"] = audio / len(results)
    return row


def _headers(args) -> dict:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def _body(args, i: int) -> dict:
    body = {"model": args.model_name, "input": args.text or TEXTS[i % len(TEXTS)], "response_format": "pcm",
            "stream_format": args.stream_format, "sample_rate": args.sample_rate}
    body.update(json.loads(args.extra_body))
    return body


async def loop_lag_under_load(url: str, streams: int, args) -> dict:
    """Run `streams` concurrent streams and read the server's event-loop lag p99 while they run."""
    lag_samples = []
    async with httpx.AsyncClient(base_url=url, timeout=600, headers=_headers(args),
                                 limits=httpx.Limits(max_connections=streams + 8)) as client:
        text = " ".join(TEXTS * 3)
        body = {**_body(args, 0), "input": text}
        tasks = [asyncio.create_task(one_request(client, body, args.stream_format == "sse", args.sample_rate))
                 for _ in range(streams)]
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0.5)
            metrics = (await client.get("/metrics")).text
            for line in metrics.splitlines():
                if line.startswith("streamvox_event_loop_lag_p99_seconds "):
                    lag_samples.append(float(line.split()[1]) * 1000)
        await asyncio.gather(*tasks)
    return {"streams": streams, "loop_lag_p99_ms_max": max(lag_samples) if lag_samples else None,
            "loop_lag_p99_ms_median": float(np.median(lag_samples)) if lag_samples else None}


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
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    server = None if args.url else start_server("--model", args.model)
    url = args.url or server.url
    args.model_name = args.model_name or httpx.get(f"{url}/v1/models", headers=_headers(args)).json()["data"][0]["id"]
    print(f"# command: {' '.join(sys.argv)}")
    print(f"# hardware: {hardware()}")
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
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "hardware": hardware(), "rows": rows, "lag": lag}, f, indent=1)


if __name__ == "__main__":
    main()

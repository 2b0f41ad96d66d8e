"""Server VAD cost: Silero through onnxruntime or TorchScript, and the event loop with many sessions talking.

1. Runtimes (`--runtimes`): the wheel's ONNX model through onnxruntime against its TorchScript model through torch,
   one thread each, in fresh processes: import + load time, CPU per 32 ms window, resident memory.
2. Sessions (`--sessions N`): N `/v1/realtime` sessions each append real-time audio (20 ms of PCM16 every 20 ms:
   espeak speech with pauses) for `--seconds`, once with server VAD on and once with it off (`turn_detection:
   null`). Reported: the server's event-loop lag while they run (its `streamvox_event_loop_lag_seconds`
   histogram, 10 ms probes), its CPU time per 20 ms frame, and the speech starts the sessions were sent.

Starts its own `streamvox serve` (espeak). Example:
  python benchmarks/vad_bench.py --runtimes --sessions 32 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import time

import httpx
import numpy as np
import websockets

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tests.helpers.server import start_server  # noqa: E402

RATE = 24000
FRAME_MS = 20
TEXTS = ["Hello there, how are you today?", "Could you tell me the way to the station, please?",
         "I think that will be all for now, thank you."]

RUNTIME_PROBE = r'''
import resource, sys, time
from importlib import metadata
import numpy as np
t0 = time.perf_counter()
suffix = "onnx" if sys.argv[1] == "onnx" else "jit"
path = metadata.distribution("silero-vad").locate_file("silero_vad/data/silero_vad." + suffix)
if sys.argv[1] == "onnx":
    import onnxruntime
    options = onnxruntime.SessionOptions(); options.intra_op_num_threads = 1; options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    state, sr = np.zeros((2, 1, 128), np.float32), np.array(16000, np.int64)
    def step(x):
        global state
        out, state = session.run(None, {"input": x, "state": state, "sr": sr})
else:
    import torch
    torch.set_num_threads(1)
    model = torch.jit.load(str(path), map_location="cpu").eval()
    def step(x):
        with torch.inference_mode():
            model(torch.from_numpy(x[:, 64:]), 16000)
loaded = time.perf_counter() - t0
x = (np.random.default_rng(0).standard_normal((1, 576)) * 0.1).astype(np.float32)
for _ in range(100):
    step(x)
n = 3000
c0 = time.process_time()
for _ in range(n):
    step(x)
cpu = (time.process_time() - c0) / n
print(loaded, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
'''


def compare_runtimes() -> None:
    for runtime in ("onnx", "torchscript"):
        rows = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", RUNTIME_PROBE, runtime], capture_output=True, text=True,
                                 check=True).stdout.split()
            rows.append([float(v) for v in out])
        loaded, cpu, rss = np.median(np.array(rows), axis=0)
        print(f"{runtime:12s} import + load {loaded * 1000:6.0f} ms, CPU per 32 ms window {cpu * 1e6:5.0f} us "
              f"(per 20 ms of audio {cpu * 1e6 * 20 / 32:4.0f} us), max RSS {rss:4.0f} MiB (median of 3 processes)")


def lag_histogram(url: str) -> tuple[np.ndarray, np.ndarray]:
    """(bucket upper bounds in s, cumulative counts) of the server's event-loop lag histogram."""
    bounds, counts = [], []
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("streamvox_event_loop_lag_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            bounds.append(float("inf") if le == "+Inf" else float(le))
            counts.append(float(line.rsplit(" ", 1)[1]))
    return np.array(bounds), np.array(counts)


def quantile(bounds: np.ndarray, counts: np.ndarray, q: float) -> str:
    """The histogram bucket that holds quantile `q` (as "<= bound")."""
    index = int(np.searchsorted(counts, q * counts[-1]))
    return f"<= {bounds[index] * 1000:g} ms" if np.isfinite(bounds[index]) else f"> {bounds[index - 1] * 1000:g} ms"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def talk(ws_url: str, frames: list[str], seconds: float, offset: int, vad: bool) -> int:
    """One session appending a frame every 20 ms for `seconds`; the speech_started events it got."""
    async with websockets.connect(f"{ws_url}/v1/realtime", max_size=None) as ws:
        turn_detection = {"type": "server_vad", "create_response": False} if vad else None
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": turn_detection}}}}))
        starts = 0

        async def read() -> None:
            nonlocal starts
            async for message in ws:
                starts += json.loads(message)["type"] == "input_audio_buffer.speech_started"

        reader = asyncio.create_task(read())
        start = time.perf_counter()
        for index in range(int(seconds * 1000 / FRAME_MS)):
            await asyncio.sleep(max(0.0, start + index * FRAME_MS / 1000 - time.perf_counter()))
            await ws.send(frames[(offset + index) % len(frames)])
        await asyncio.sleep(0.5)
        reader.cancel()
        return starts


async def sessions(ws_url: str, frames: list[str], count: int, seconds: float, vad: bool) -> int:
    starts = await asyncio.gather(*(talk(ws_url, frames, seconds, 37 * i, vad) for i in range(count)))
    return sum(starts)


def measure_sessions(count: int, seconds: float) -> None:
    server = start_server()
    try:
        clips = [np.frombuffer(httpx.post(f"{server.url}/v1/audio/speech", timeout=60, json={
            "input": text, "response_format": "pcm", "sample_rate": RATE}).content, "<i2") for text in TEXTS]
        pause = np.zeros(RATE, np.int16)
        audio = np.concatenate([part for clip in clips for part in (clip, pause)]).tobytes()
        step = RATE * FRAME_MS // 1000 * 2
        frames = [json.dumps({"type": "input_audio_buffer.append",
                              "audio": base64.b64encode(audio[i:i + step]).decode()})
                  for i in range(0, len(audio) - step + 1, step)]
        ws_url = server.url.replace("http", "ws", 1)
        n_frames = count * seconds * 1000 / FRAME_MS
        print(f"{count} sessions x {seconds:g} s of real-time audio ({FRAME_MS} ms frames); "
              f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        for vad in (False, True):
            bounds, before = lag_histogram(server.url)
            cpu0 = cpu_seconds(server.process.pid)
            starts = asyncio.run(sessions(ws_url, frames, count, seconds, vad))
            cpu = cpu_seconds(server.process.pid) - cpu0
            _, after = lag_histogram(server.url)
            counts = after - before
            print(f"VAD {'on ' if vad else 'off'}: event-loop lag p50 {quantile(bounds, counts, 0.5)}, "
                  f"p99 {quantile(bounds, counts, 0.99)}, p99.9 {quantile(bounds, counts, 0.999)} "
                  f"({int(counts[-1])} probes); server CPU {cpu * 1e6 / n_frames:.0f} us per frame "
                  f"({cpu / seconds * 100:.0f}% of a core); speech starts heard: {starts}", flush=True)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtimes", action="store_true", help="compare onnxruntime and TorchScript")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    if args.runtimes:
        compare_runtimes()
    if args.sessions:
        measure_sessions(args.sessions, args.seconds)


if __name__ == "__main__":
    main()

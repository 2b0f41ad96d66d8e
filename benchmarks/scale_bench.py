"""Replicas on Ray Serve next to a direct server: TTFP and audio seconds per second, side by side.

One run measures, with serving_bench's load (its `run_level`, same requests and timings):
  direct       `streamvox serve` on its own (no Ray)
  N replica(s) the same server as N replicas behind Ray Serve's proxy (`streamvox serve --replicas N`),
               for each N of --replicas, on one local, loopback-only Ray instance
Each replica takes --replica-max-streams streams (default: the largest --concurrency), so no request waits
in Serve's queue and the proxy's cost is what differs.

CPU, espeak:
  python benchmarks/scale_bench.py --model espeak --stream-format sse --concurrency 1 8 32
GPUs, one replica per GPU (a cluster of several machines: start Ray there first and pass --ray-address):
  python benchmarks/scale_bench.py --model /models/Qwen3-TTS-12Hz-1.7B-Base --max-batch 64 --replicas 1 2 4 \\
      --stream-format audio --concurrency 64 128 256 --extra-body '{"voice": "anna"}'
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.serving_bench import hardware, run_level  # noqa: E402
from tests.helpers.ray_serve import proxy_pid  # noqa: E402
from tests.helpers.server import free_port, start_server  # noqa: E402


def measure(url: str, args, proxy: int | None = None) -> list[dict]:
    """serving_bench's levels against `url`; with `proxy` (its pid), also the proxy's CPU per audio second."""
    args.model_name = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    rows = []
    for concurrency in args.concurrency:
        n = args.requests_per_level or max(16, 4 * concurrency)
        before = cpu_seconds(proxy) if proxy else 0.0
        row = asyncio.run(run_level(url, concurrency, n, args))
        if proxy:
            row["cpu_ms_per_audio_s_proxy"] = (cpu_seconds(proxy) - before) / (n * row["mean_audio_s"]) * 1000
        rows.append(row)
        print(json.dumps({"system": args.system, **row}), flush=True)
    return rows


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="espeak")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--replica-max-streams", type=int, default=None)
    parser.add_argument("--ray-address", default=None, help="a running Ray cluster; otherwise a local one starts")
    parser.add_argument("--skip-direct", action="store_true")
    parser.add_argument("--stream-format", choices=("sse", "audio"), default="sse")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests-per-level", type=int, default=0, help="default: max(16, 4 x concurrency)")
    parser.add_argument("--sample-rate", type=int, default=24000)
    parser.add_argument("--text", default=None)
    parser.add_argument("--extra-body", default="{}")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    args.client, args.api_key = "raw", None
    print(f"# command: {' '.join(sys.argv)}")
    print(f"# hardware: {hardware()}; load average before start: {os.getloadavg()[0]:.2f}")
    model_flags = ["--model", args.model, "--device", args.device]
    if args.max_batch:
        model_flags += ["--max-batch", str(args.max_batch)]
    results: dict[str, list[dict]] = {}
    if not args.skip_direct:
        server = start_server(*model_flags)
        try:
            args.system = "direct"
            args.server_pid = server.process.pid
            args.core_pid = httpx.get(f"{server.url}/health", timeout=30).json()["engine_pid"]
            results["direct"] = measure(server.url, args)
        finally:
            server.stop()
            args.server_pid = None
    if args.replicas:
        results.update(measure_replicas(args))
    print("\n| system | concurrency | TTFP p50 ms | TTFP p95 ms | E2E p50 ms | RTF p50 | audio s/s "
          "| CPU ms per audio s: server (direct) or proxy |")
    print("|---|---|---|---|---|---|---|---|")
    for system, rows in results.items():
        for r in rows:
            cpu = r.get("cpu_ms_per_audio_s_server", r.get("cpu_ms_per_audio_s_proxy", float("nan")))
            print(f"| {system} | {r['concurrency']} | {r['ttfp_ms_p50']:.1f} | {r['ttfp_ms_p95']:.1f} "
                  f"| {r['e2e_ms_p50']:.1f} | {r['rtf_p50']:.4f} | {r['audio_s_per_s']:.1f} | {cpu:.2f} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "hardware": hardware(), "results": results}, f, indent=1)


def measure_replicas(args) -> dict[str, list[dict]]:
    from streamvox.scale import launch
    from streamvox.scale.options import ScaleOptions
    from streamvox.server.app import ServerSettings

    port = free_port()
    streams = args.replica_max_streams or max(args.concurrency)
    options = ScaleOptions(replicas=max(args.replicas), ray_address=args.ray_address, port=port,
                           max_streams=streams, max_queued=streams)
    settings = ServerSettings(model=args.model, model_options={"device": args.device, "dtype": "auto",
                                                               "max_batch": args.max_batch})
    launch.start_ray(options, log_to_driver=False)
    from ray import serve  # after start_ray, which sets Ray's local-only mode before the first import

    results = {}
    try:
        for count in args.replicas:
            launch.deploy(settings, dataclasses.replace(options, replicas=count))
            args.system = f"{count} replica{'s' if count > 1 else ''}"
            results[args.system] = measure(f"http://127.0.0.1:{port}", args, proxy=proxy_pid())
            serve.delete(launch.APP_NAME)
    finally:
        launch.stop(options)
    return results


if __name__ == "__main__":
    main()

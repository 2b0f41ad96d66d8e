"""Time to first audio through LiveKit's TTS plugins while an LLM's text arrives at 20 tokens a second.

Three ways a LiveKit agent can speak through StreamVox, against the same server in the same run:
  openai          `tts.StreamAdapter(openai.TTS(base_url=.../v1))`: the OpenAI plugin takes one whole text per
                  request, so the adapter waits for a complete sentence, then POSTs it (pcm);
  cartesia        `cartesia.TTS(base_url=...)` at its defaults: LiveKit's sentence tokenizer sends each sentence
                  into one context on one socket (`WS /tts/websocket`), the generation runs across them;
  cartesia-words  the same plugin with a tokenizer that hands on each word (as soon as the next one starts): every
                  word goes into the running generation, so speech starts before the first sentence is complete.
Each text (the longer lines of benchmarks/corpus/open_loop_en.txt) arrives one word every 50 ms; TTFA is the
time from its first word to the first audio frame the plugin hands the agent. The paths take turns, text by text,
one utterance at a time (no load besides). Starts its own `streamvox serve --model MODEL` unless --url is given,
and runs the LiveKit side with the clients venv's python (scripts/setup_clients_venv.sh DIR). Example:
  python benchmarks/cartesia_ttfa_bench.py --texts 12 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CORPUS = os.path.join(ROOT, "benchmarks", "corpus", "open_loop_en.txt")
PATHS = ("openai", "cartesia", "cartesia-words")
TOKEN_INTERVAL_S = 0.05  # 20 tokens a second
API_KEY = "ttfa-bench"


def texts(count: int, min_words: int = 16) -> list[str]:
    with open(CORPUS) as corpus:
        lines = [line.strip() for line in corpus if len(line.split()) >= min_words]
    return lines[:count]


def tokens(text: str) -> list[str]:
    """An LLM's tokens, roughly: words, each with its leading space."""
    words = text.split(" ")
    return [words[0]] + [" " + word for word in words[1:]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


# The LiveKit side, run with the clients venv's python (`--client`).

async def _measure(engine, text: str) -> dict:
    stream = engine.stream()
    start = time.perf_counter()

    async def push() -> None:
        for token in tokens(text):
            stream.push_text(token)
            await asyncio.sleep(TOKEN_INTERVAL_S)
        stream.end_input()

    pusher = asyncio.create_task(push())
    first, samples, rate = None, 0, 0
    async for audio in stream:
        if first is None:
            first = time.perf_counter() - start
        samples += audio.frame.samples_per_channel
        rate = audio.frame.sample_rate
    await pusher
    await stream.aclose()
    return {"ttfa_s": first, "total_s": time.perf_counter() - start, "audio_s": samples / rate if rate else 0}


def _words(text: str) -> list[tuple[str, int, int]]:
    return [(m.group(), m.start(), m.end()) for m in re.finditer(r"\S+", text)]


async def client(url: str, voice: str, corpus: list[str], rounds: int) -> dict:
    import aiohttp
    from livekit.agents import tokenize, tts
    from livekit.agents.tokenize.token_stream import BufferedSentenceStream
    from livekit.plugins import cartesia, openai

    class WordsAsSentences(tokenize.SentenceTokenizer):
        """Hands on every word as soon as the next one starts (the Cartesia plugin takes sentence tokenizers)."""

        def tokenize(self, text: str, *, language: str | None = None) -> list[str]:
            return text.split()

        def stream(self, *, language: str | None = None) -> BufferedSentenceStream:
            return BufferedSentenceStream(tokenizer=_words, min_token_len=1, min_ctx_len=1)

    async with aiohttp.ClientSession() as http:
        engines = {
            "openai": tts.StreamAdapter(tts=openai.TTS(base_url=f"{url}/v1", api_key=API_KEY, voice=voice,
                                                       response_format="pcm")),
            "cartesia": cartesia.TTS(base_url=url, api_key=API_KEY, voice=voice, http_session=http),
            "cartesia-words": cartesia.TTS(base_url=url, api_key=API_KEY, voice=voice, http_session=http,
                                           tokenizer=WordsAsSentences()),
        }
        try:
            for engine in engines.values():  # warm: connections open, first requests served
                await _measure(engine, corpus[0])
            runs = {path: [] for path in PATHS}
            for r in range(rounds):
                for i, text in enumerate(corpus):
                    order = PATHS[(i + r) % len(PATHS):] + PATHS[:(i + r) % len(PATHS)]
                    for path in order:
                        runs[path].append({"text": i, **await _measure(engines[path], text)})
        finally:
            for engine in engines.values():
                await engine.aclose()
    return runs


# The driver, run with StreamVox's python.

def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    table = {}
    for path, results in runs.items():
        ttfa = [r["ttfa_s"] * 1000 for r in results if r["ttfa_s"] is not None]
        table[path] = {"n": len(results), "ttfa_ms_p50": statistics.median(ttfa), "ttfa_ms_p90": percentile(ttfa, 90),
                       "ttfa_ms_mean": statistics.fmean(ttfa), "failed": len(results) - len(ttfa)}
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (started with --api-key ttfa-bench) instead of starting one")
    parser.add_argument("--model", default="espeak")
    parser.add_argument("--voice", default="alloy")
    parser.add_argument("--texts", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients-venv", default=os.environ.get("STREAMVOX_CLIENTS_VENV",
                                                                 os.path.join(ROOT, ".clients-venv")))
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    corpus = texts(args.texts)
    if args.client:
        print(json.dumps(asyncio.run(client(args.url, args.voice, corpus, args.rounds))))
        return

    sys.path.insert(0, ROOT)
    from tests.helpers.server import start_server

    server = None if args.url else start_server("--model", args.model, api_key=API_KEY)
    url = args.url or server.url
    try:
        python = os.path.join(args.clients_venv, "bin", "python")
        command = [python, os.path.abspath(__file__), "--client", "--url", url, "--voice", args.voice,
                   "--texts", str(args.texts), "--rounds", str(args.rounds)]
        process = subprocess.run(command, capture_output=True, text=True)
        if process.returncode:
            raise SystemExit(process.stderr[-4000:])
        runs = json.loads(process.stdout.strip().splitlines()[-1])
    finally:
        if server is not None:
            server.stop()
    table = summarize(runs)
    first_sentence_s = statistics.median(
        len(tokens(text.split(". ")[0])) * TOKEN_INTERVAL_S for text in corpus)
    print(f"model {args.model}, {len(corpus)} texts x {args.rounds} rounds, text at {1 / TOKEN_INTERVAL_S:g} tokens/s "
          f"(first sentence complete after {first_sentence_s:.2f} s, median); {platform.machine()}, "
          f"{os.cpu_count()} cores")
    print(f"{'path':16} {'n':>4} {'TTFA p50 ms':>12} {'p90 ms':>8} {'mean ms':>8} {'failed':>7}")
    for path, row in table.items():
        print(f"{path:16} {row['n']:>4} {row['ttfa_ms_p50']:>12.0f} {row['ttfa_ms_p90']:>8.0f} "
              f"{row['ttfa_ms_mean']:>8.0f} {row['failed']:>7}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"model": args.model, "texts": len(corpus), "rounds": args.rounds, "summary": table,
                       "runs": runs}, out, indent=1)


if __name__ == "__main__":
    main()

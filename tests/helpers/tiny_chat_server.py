"""A small OpenAI-compatible chat server for tests: streams tokens from a real (tiny, random-weight) Qwen3 model.

Runs `transformers`' Qwen3ForCausalLM token by token (with its KV cache) in a worker thread and streams each
decoded delta as an SSE `chat.completion.chunk` as soon as it is sampled. A client disconnect stops the
generation. `GET /stats` reports the generations running and the number started, finished and aborted, so
tests can check that the thinker's requests are aborted on barge-in.

    python tests/helpers/tiny_chat_server.py MODEL_DIR PORT [--token-delay-s S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from transformers import AutoModelForCausalLM, AutoTokenizer


def chatml(messages: list[dict]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + \
        "<|im_start|>assistant\n"


class Generator:
    def __init__(self, model_dir: str, token_delay_s: float) -> None:
        torch.set_num_threads(1)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        self.name = model_dir.rstrip("/").rsplit("/", 1)[-1]
        self.token_delay_s = token_delay_s
        self.stats = {"running": 0, "started": 0, "finished": 0, "aborted": 0, "last_messages": None,
                      "last_finish_reason": None}
        self.lock = threading.Lock()

    def run(self, prompt: str, max_tokens: int, temperature: float, seed: int | None, emit,
            stop: threading.Event) -> str | None:
        """Why it ended, as OpenAI's `finish_reason`: "stop" (end of turn) or "length" (`max_tokens`); None if
        aborted."""
        with self.lock:
            self.stats["running"] += 1
            self.stats["started"] += 1
        outcome, reason = "finished", "length"
        try:
            generator = torch.Generator().manual_seed(seed if seed is not None else 0)
            ids = self.tokenizer(prompt, return_tensors="pt").input_ids
            past, produced, text = None, [], ""
            eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
            with torch.no_grad():
                for _ in range(max_tokens):
                    if stop.is_set():
                        outcome, reason = "aborted", None
                        return None
                    out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    logits = out.logits[0, -1].float()
                    if temperature > 0:
                        probs = torch.softmax(logits / temperature, dim=-1)
                        token = int(torch.multinomial(probs, 1, generator=generator))
                    else:
                        token = int(torch.argmax(logits))
                    if token == eos:
                        reason = "stop"
                        break
                    produced.append(token)
                    ids = torch.tensor([[token]])  # the next step's input, whether or not text comes out now
                    if self.token_delay_s:
                        time.sleep(self.token_delay_s)
                    new_text = self.tokenizer.decode(produced, skip_special_tokens=True)
                    if new_text.endswith("\ufffd"):
                        continue  # an unfinished UTF-8 sequence: wait for the next token
                    emit(new_text[len(text):])
                    text = new_text
        finally:
            with self.lock:
                self.stats["running"] -= 1
                self.stats[outcome] += 1
                self.stats["last_finish_reason"] = reason
        return reason


def build_app(generator: Generator) -> Starlette:
    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": generator.name, "object": "model"}]})

    async def stats(request: Request):
        return JSONResponse(generator.stats)

    async def chat(request: Request):
        body = await request.json()
        generator.stats["last_messages"] = body["messages"]
        if "__fail__" in body["messages"][-1]["content"]:  # for tests of the failure path
            return JSONResponse({"error": {"message": "asked to fail", "type": "server_error"}}, status_code=500)
        prompt = chatml(body["messages"])
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 64)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()

        def emit(delta: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, delta)

        ended: list[str | None] = [None]

        def work() -> None:
            try:
                ended[0] = generator.run(prompt, max_tokens, float(body.get("temperature", 1.0)), body.get("seed"),
                                         emit, stop)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        threading.Thread(target=work, daemon=True).start()
        cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"

        def chunk(delta: dict, finish: str | None = None) -> str:
            return "data: " + json.dumps({"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                                          "model": generator.name, "choices": [
                                              {"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"

        async def events():
            try:
                yield chunk({"role": "assistant", "content": ""})
                while (delta := await queue.get()) is not None:
                    yield chunk({"content": delta})
                yield chunk({}, ended[0] or "stop")
                yield "data: [DONE]\n\n"
            finally:
                stop.set()  # the client went away (or we finished): stop generating

        if not body.get("stream"):
            stop.set()
            return JSONResponse({"error": {"message": "only stream=true is supported here"}}, status_code=400)
        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/stats", stats),
                             Route("/v1/chat/completions", chat, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("port", type=int)
    parser.add_argument("--token-delay-s", type=float, default=0.0)
    args = parser.parse_args()
    app = build_app(Generator(args.model_dir, args.token_delay_s))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

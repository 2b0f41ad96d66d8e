"""The thinker: an LLM whose token stream is spoken as it is generated.

Two implementations behind one interface, `Thinker.stream(messages, request_id)`, an async iterator of text
deltas that stops (and frees the LLM's state for the request) when the consumer stops iterating; its
`on_finish` hears why the LLM stopped ("length": at the token limit):

- `VLLMThinker`: vLLM's `AsyncLLM` in this process (its engine core runs in a process of its own), for
  `streamvox serve --llm DIR_OR_REPO`. vLLM is an optional extra (`pip install -e '.[llm]'`) and is imported
  only here, only when asked for.
- `OpenAIChatThinker`: any OpenAI-compatible `/v1/chat/completions` endpoint with `stream: true`, for
  `--llm-url`.

A thinker fails with a `StageError` whose code is "thinker_failed", "thinker_unavailable" (the endpoint cannot
be reached) or "vllm_missing".
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import httpx

from streamvox.agent.errors import StageError
from streamvox.agent.vllm_engine import VLLMEngine, VLLMStage
from streamvox.settings import AgentSettings

log = logging.getLogger(__name__)

TOP_P = 0.95


class Thinker:
    """Interface. Subclasses implement `start`, `stream`, `count_tokens`, `shutdown`."""

    name = "thinker"
    settings: AgentSettings

    async def start(self) -> None:
        pass

    def stream(self, messages: list[dict], request_id: str, max_tokens: int | None = None,
               on_finish: Callable[[str | None], None] | None = None) -> AsyncIterator[str]:
        raise NotImplementedError

    def count_tokens(self, text: str) -> int:
        return max(1, len(text) // 4)

    @property
    def active_requests(self) -> int:
        return 0

    async def shutdown(self) -> None:
        pass


def chatml_prompt(messages: list[dict]) -> str:
    """Qwen's ChatML layout, used when the tokenizer has no chat template of its own."""
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


class VLLMThinker(VLLMStage, Thinker):
    """vLLM's AsyncLLM, in-process. One vLLM request per response; aborted on cancel."""

    name = "vllm"

    def __init__(self, model: str, settings: AgentSettings, *, max_model_len: int = 4096,
                 dtype: str = "auto", enforce_eager: bool = True) -> None:
        self.model = model
        self.settings = settings
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.engine: VLLMEngine | None = None
        self.tokenizer = None

    async def start(self) -> None:
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise StageError("--llm needs vLLM: pip install -e '.[llm]' (or scripts/setup_vllm_venv.sh DIR), "
                               f"or use --llm-url with an OpenAI-compatible server ({exc})", "vllm_missing") from exc
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        args = AsyncEngineArgs(model=self.model, max_model_len=self.max_model_len, dtype=self.dtype,
                               enforce_eager=self.enforce_eager, seed=self.settings.seed or 0,
                               disable_log_stats=True, max_num_seqs=16)
        self.engine = VLLMEngine(await asyncio.to_thread(AsyncLLM.from_engine_args, args))
        self.tokenizer = await _get_tokenizer(self.engine.llm)

    def count_tokens(self, text: str) -> int:
        if self.tokenizer is None:
            return super().count_tokens(text)
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _prompt(self, messages: list[dict]) -> str:
        tokenizer = self.tokenizer
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return chatml_prompt(messages)

    async def stream(self, messages: list[dict], request_id: str, max_tokens: int | None = None,
                     on_finish: Callable[[str | None], None] | None = None) -> AsyncIterator[str]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = self.settings
        params = SamplingParams(max_tokens=max_tokens or s.max_tokens, temperature=s.temperature, top_p=TOP_P,
                                seed=s.seed, output_kind=RequestOutputKind.DELTA)
        async with aclosing(self.engine.deltas(self._prompt(messages), params, request_id, on_finish)) as deltas:
            async for delta in deltas:
                yield delta


async def _get_tokenizer(llm):
    tokenizer = llm.get_tokenizer() if hasattr(llm, "get_tokenizer") else llm.tokenizer
    if asyncio.iscoroutine(tokenizer):
        tokenizer = await tokenizer
    return getattr(tokenizer, "tokenizer", tokenizer)


class OpenAIChatThinker(Thinker):
    """An external OpenAI-compatible chat endpoint, streamed (`stream: true`, SSE)."""

    name = "openai-chat"

    def __init__(self, base_url: str, settings: AgentSettings, *, model: str | None = None,
                 api_key: str | None = None, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.settings = settings
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.client: httpx.AsyncClient | None = None
        self._active: set[str] = set()

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(self.timeout_s, connect=10.0))
        if self.model is None:  # the endpoint's first model
            try:
                response = await self.client.get(f"{self.base_url}/models")
                response.raise_for_status()
                self.model = response.json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                raise StageError(f"Could not list the models of {self.base_url}: {exc}. Pass --llm-model.",
                                   "thinker_unavailable") from exc

    async def stream(self, messages: list[dict], request_id: str, max_tokens: int | None = None,
                     on_finish: Callable[[str | None], None] | None = None) -> AsyncIterator[str]:
        s = self.settings
        body = {"model": self.model, "messages": messages, "stream": True, "max_tokens": max_tokens or s.max_tokens,
                "temperature": s.temperature, "top_p": TOP_P}
        if s.seed is not None:
            body["seed"] = s.seed
        self._active.add(request_id)
        try:
            async with self.client.stream("POST", f"{self.base_url}/chat/completions", json=body,
                                          headers={"X-Request-Id": request_id}) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")[:500]
                    raise StageError(f"The LLM endpoint answered {response.status_code}: {text}", "thinker_failed")
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        continue
                    if "error" in chunk:
                        raise StageError(f"The LLM endpoint failed: {chunk['error']}", "thinker_failed")
                    for choice in chunk.get("choices") or []:
                        if delta := (choice.get("delta") or {}).get("content"):
                            yield delta
                        if choice.get("finish_reason") and on_finish is not None:
                            on_finish(choice["finish_reason"])
        except httpx.HTTPError as exc:
            raise StageError(f"The LLM endpoint {self.base_url} failed: {exc!r}", "thinker_unavailable") from exc
        finally:
            # Leaving the `async with` closes the HTTP stream: the endpoint sees the disconnect and aborts.
            self._active.discard(request_id)

    @property
    def active_requests(self) -> int:
        return len(self._active)

    async def shutdown(self) -> None:
        if self.client is not None:
            await self.client.aclose()

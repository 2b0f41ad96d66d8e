"""What a server answers with: the thinker (optional) and the speech recogniser (optional).

The realtime route calls this interface only; without a thinker it keeps its "echo" responder (it speaks the
user's own text), without a transcriber `input_audio_buffer.commit` is refused.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry, Gauge

from streamvox.agent.asr import Transcriber, VLLMWhisper
from streamvox.agent.history import truncate_history
from streamvox.agent.thinker import OpenAIChatThinker, Thinker, VLLMThinker
from streamvox.settings import AgentSettings

log = logging.getLogger(__name__)


class Responder:
    """The stages a server was started with (`AgentSettings`): started, measured and shut down together."""

    def __init__(self, settings: AgentSettings) -> None:
        if settings.llm and settings.llm_url:
            raise ValueError("give --llm or --llm-url, not both")
        self.settings = settings
        self.thinker: Thinker | None = None
        if settings.llm:
            self.thinker = VLLMThinker(settings.llm, settings,
                                       max_model_len=max(settings.context_tokens + settings.max_tokens, 512))
        elif settings.llm_url:
            self.thinker = OpenAIChatThinker(settings.llm_url, settings, model=settings.llm_model,
                                             api_key=settings.llm_api_key)
        self.transcriber: Transcriber | None = VLLMWhisper(settings.asr) if settings.asr else None

    async def start(self) -> None:
        """Start the stages side by side (each vLLM engine takes a while to spawn its processes)."""
        stages = [stage for stage in (self.thinker, self.transcriber) if stage is not None]
        results = await asyncio.gather(*(stage.start() for stage in stages), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                await self.shutdown()
                raise result

    async def shutdown(self) -> None:
        for stage in (self.thinker, self.transcriber):
            if stage is not None:
                try:
                    await stage.shutdown()
                except Exception:
                    log.exception("stage shutdown failed")

    def register_metrics(self, registry: CollectorRegistry) -> None:
        Gauge("streamvox_thinker_active_requests", "Thinker (LLM) requests in flight, as the LLM engine counts them.",
              registry=registry).set_function(lambda: self.thinker.active_requests if self.thinker else 0)
        Gauge("streamvox_asr_active_requests", "Speech recognition requests in flight.",
              registry=registry).set_function(lambda: self.transcriber.active_requests if self.transcriber else 0)

    def describe(self) -> dict:
        thinker = None
        if self.thinker is not None:
            thinker = {"kind": self.thinker.name, "model": getattr(self.thinker, "model", None),
                       "max_tokens": self.settings.max_tokens, "context_tokens": self.settings.context_tokens}
        asr = None if self.transcriber is None else {"kind": self.transcriber.name, "model": self.transcriber.model}
        return {"responder": "thinker" if thinker else "echo", "thinker": thinker, "asr": asr}

    def messages(self, history: list[dict], instructions: str) -> list[dict]:
        """Chat messages for the thinker: instructions as the system message, then the history, within budget."""
        messages = [{"role": "system", "content": instructions}] if instructions.strip() else []
        messages += [m for m in history if m["content"].strip()]
        count = self.thinker.count_tokens if self.thinker is not None else (lambda text: len(text) // 4 + 1)
        return truncate_history(messages, self.settings.context_tokens, count)

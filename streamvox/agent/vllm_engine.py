"""Requests through an in-process vLLM `AsyncLLM`, as the transcriber (asr.py) and the thinker (thinker.py) make them.

Each request streams text deltas and is aborted in vLLM when its consumer stops iterating before the end, so the
engine never keeps generating for nobody. `VLLMStage` is what both stages share once started: the count the
metrics read and the shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any


class VLLMEngine:
    """A started `AsyncLLM` and the ids of the requests streaming through it."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self._active: set[str] = set()

    async def deltas(self, prompt: Any, params: Any, request_id: str,
                     on_finish: Callable[[str | None], None] | None = None) -> AsyncIterator[str]:
        """The request's text deltas (`params` asks for `RequestOutputKind.DELTA`); `on_finish` gets why it ended
        ("stop", "length", ...) once it has."""
        self._active.add(request_id)
        finished = False
        try:
            async for output in self.llm.generate(prompt, params, request_id):
                if output.outputs and output.outputs[0].text:
                    yield output.outputs[0].text
                finished = output.finished
                if finished and on_finish is not None:
                    on_finish(output.outputs[0].finish_reason if output.outputs else None)
        finally:
            self._active.discard(request_id)
            if not finished:
                await self.llm.abort(request_id)

    @property
    def active_requests(self) -> int:
        """Requests the engine still holds (unfinished or not yet freed)."""
        processor = getattr(self.llm, "output_processor", None)
        if processor is not None and hasattr(processor, "get_num_unfinished_requests"):
            return processor.get_num_unfinished_requests()
        return len(self._active)

    def shutdown(self) -> None:
        self.llm.shutdown()


class VLLMStage:
    """A stage that runs on a `VLLMEngine` once `start` has set `engine`; mixed in before its interface class."""

    engine: VLLMEngine | None = None

    @property
    def active_requests(self) -> int:
        return 0 if self.engine is None else self.engine.active_requests

    async def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

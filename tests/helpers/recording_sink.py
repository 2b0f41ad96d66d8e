"""An `OutputSink` that records what a runner sends it, for runner tests."""

from __future__ import annotations


class RecordingSink:
    """Each call as a tuple in `log`: ("audio", id, samples), ("words", id, timings), ("finished", id, reason),
    ("failed", id, message)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []

    def audio(self, request_id, pcm):
        self.log.append(("audio", request_id, len(pcm)))

    def words(self, request_id, timings):
        self.log.append(("words", request_id, timings))

    def finished(self, request_id, reason, input_tokens, output_tokens):
        self.log.append(("finished", request_id, reason))

    def failed(self, request_id, error):
        self.log.append(("failed", request_id, error.message))

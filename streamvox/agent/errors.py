"""The failure of a voice-agent stage, carrying the `code` of the error event a client receives."""

from __future__ import annotations


class StageError(Exception):
    """A stage failed; `code` defaults to the stage's own (`default_code`)."""

    default_code = "stage_failed"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code

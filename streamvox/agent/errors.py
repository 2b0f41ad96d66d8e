"""The failure of a voice-agent stage (the thinker or the speech recogniser)."""

from __future__ import annotations


class StageError(Exception):
    """A stage failed; `code` is what the client's error object carries (e.g. "thinker_failed")."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

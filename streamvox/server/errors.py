"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from starlette.responses import JSONResponse

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          409: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}


class APIError(Exception):
    """Raised anywhere in a route; turned into a JSON error response."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code or {400: "invalid_value", 401: "invalid_api_key", 404: "not_found"}.get(status)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)

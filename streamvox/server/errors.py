"""The server's one error type, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

HTTP routes answer an `APIError` with its status; the WebSocket protocols send its message, code and
param in their own `error` event (the status then only says whose fault it was).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          409: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}


class APIError(Exception):
    """Raised anywhere in a route or a WebSocket message handler; answered as an error, the server goes on."""

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


def internal_error() -> APIError:
    """What a client is told of a bug (the traceback goes to the log)."""
    return APIError(500, "Internal server error.", code="internal_error")


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Unknown routes (404) and methods (405) in OpenAI's error shape, like every other error."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = {404: f"No route {request.url.path}.", 405: f"{request.method} is not allowed on {request.url.path}."
               }.get(exc.status_code, str(exc.detail))
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A bug: still answer in OpenAI's shape (the traceback goes to the log)."""
    return internal_error().response()


# Starlette's `exception_handlers` for the application.
ERROR_HANDLERS = {HTTPException: _http_error, Exception: _server_error}

"""`GET /demo`: a plain HTML + JavaScript client of `/v1/realtime` (static files, no build step).

The page and its scripts hold no secrets, so they are served without an API key; the page
itself authenticates its WebSocket with the `openai-insecure-api-key.<key>` subprotocol when
opened as `/demo?api_key=KEY`.
"""

from __future__ import annotations

from pathlib import Path

from starlette.responses import RedirectResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).with_name("static")
PUBLIC_PREFIX = "/demo"


def is_public_path(path: str) -> bool:
    return path == PUBLIC_PREFIX or path.startswith(PUBLIC_PREFIX + "/")


async def _to_index(request) -> RedirectResponse:
    query = request.url.query
    return RedirectResponse(f"{PUBLIC_PREFIX}/" + (f"?{query}" if query else ""))


def demo_routes() -> list:
    return [Route(PUBLIC_PREFIX, _to_index), Mount(PUBLIC_PREFIX, StaticFiles(directory=STATIC_DIR, html=True))]

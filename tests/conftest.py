"""Shared fixtures: real `streamvox serve` processes on real ports."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from streamvox.engine.client import AsyncEngine
from tests.helpers.server import Server, start_server


@pytest.fixture(scope="session")
def espeak_server() -> Iterator[Server]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def engine_run():
    """Run `body(engine)` against an `AsyncEngine` on the espeak model, started and shut down around it."""
    async def run(body):
        engine = AsyncEngine("espeak", restart_on_crash=False)
        await engine.start()
        try:
            return await body(engine)
        finally:
            await engine.shutdown()

    return lambda body: asyncio.run(run(body))

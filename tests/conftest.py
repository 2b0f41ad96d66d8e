"""Shared fixtures: real `streamvox serve` processes on real ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.server import Server, start_server


@pytest.fixture(scope="session")
def espeak_server() -> Iterator[Server]:
    server = start_server()
    yield server
    server.stop()

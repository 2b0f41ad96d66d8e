"""A replica's health follows its engine: through the engine's own restarts, failing only when it stays down."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from streamvox.scale.health import EngineHealth, ReplicaUnhealthy


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def state(ready: bool, exit_code: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(engine=SimpleNamespace(is_ready=ready, restarts=2), engine_exit_code=exit_code)


def test_a_short_engine_restart_keeps_the_replica_healthy():
    clock = Clock()
    health = EngineHealth(unhealthy_after_s=60, clock=clock)
    health.check(state(True))
    health.check(state(False))  # the core died; the engine restarts it
    clock.now += 59
    health.check(state(False))
    health.check(state(True))  # back: the clock starts again at the next outage
    clock.now += 30
    health.check(state(False))
    clock.now += 59
    health.check(state(False))


def test_an_engine_down_for_too_long_fails_the_check():
    clock = Clock()
    health = EngineHealth(unhealthy_after_s=60, clock=clock)
    health.check(state(False))
    clock.now += 61
    with pytest.raises(ReplicaUnhealthy, match="unavailable for 61 s"):
        health.check(state(False))


def test_an_engine_that_exited_for_good_fails_at_once():
    with pytest.raises(ReplicaUnhealthy, match="exited"):
        EngineHealth(unhealthy_after_s=60).check(state(False, exit_code=-9))

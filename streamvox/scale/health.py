"""A replica's health, as Serve's `check_health` asks for it: it follows the engine.

The engine restarts its core by itself after a crash, within seconds (with backoff if the core
keeps failing): a replica stays healthy through that, or Serve would kill a whole replica, and every
stream on it, to fix what the engine fixes alone. It fails once the engine has been unavailable for
`unhealthy_after_s`, and at once when the engine exited for good (`--exit-on-engine-crash`); Serve
then replaces the replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ReplicaUnhealthy(RuntimeError):
    pass


class EngineHealth:
    def __init__(self, unhealthy_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.unhealthy_after_s = unhealthy_after_s
        self.clock = clock
        self.down_since: float | None = None

    def check(self, state) -> None:
        """`state`: the app's `AppState`. Raises `ReplicaUnhealthy` when Serve should replace the replica."""
        if state.engine_exit_code is not None:
            raise ReplicaUnhealthy(f"the engine core exited ({state.engine_exit_code}) and is not restarted")
        if state.engine.is_ready:
            self.down_since = None
            return
        now = self.clock()
        if self.down_since is None:
            self.down_since = now
        if now - self.down_since > self.unhealthy_after_s:
            raise ReplicaUnhealthy(f"the engine has been unavailable for {now - self.down_since:.0f} s "
                                   f"({state.engine.restarts} restarts)")

"""Spreading bursts of work over event-loop iterations, so no single iteration runs long.

Everything that runs in one iteration of the event loop delays every timer and
every other stream by its sum. Bursts are normal here: the engine core sends
the audio of a few hundred requests in one message, and a few hundred clients
can connect in the same millisecond. Tasks that are about to do a known amount
of work on the loop therefore wait for a turn first. Each iteration grants
turns, oldest first, until their estimated costs add up to `budget_ms`; the
tasks woken then run in the next iteration, and the rest wait for the one
after. At least one turn is granted per iteration, so nothing starves.

Costs are estimates in milliseconds of loop time (see the callers); they only
need to be right in proportion.
"""

from __future__ import annotations

import asyncio
from collections import deque


class LoopTurns:
    def __init__(self, budget_ms: float = 2.0) -> None:
        self.budget_ms = budget_ms
        self._waiting: deque[tuple[asyncio.Future, float]] = deque()
        self._granting = False

    def queue(self, turn: asyncio.Future, cost_ms: float) -> None:
        """Resolve `turn` when its turn comes."""
        self._waiting.append((turn, cost_ms))
        if not self._granting:
            self._granting = True
            asyncio.get_running_loop().call_soon(self._grant)

    async def wait(self, cost_ms: float) -> None:
        """Return in an iteration that runs at most about `budget_ms` of such work."""
        turn = asyncio.get_running_loop().create_future()
        self.queue(turn, cost_ms)
        await turn

    def _grant(self) -> None:
        waiting = self._waiting
        budget = self.budget_ms
        while waiting and budget > 0:
            turn, cost_ms = waiting.popleft()
            if not turn.done():  # a cancelled waiter costs nothing
                budget -= cost_ms
                turn.set_result(None)
        if waiting:  # the rest in the next iteration, after the tasks just woken have run
            asyncio.get_running_loop().call_soon(self._grant)
        else:
            self._granting = False

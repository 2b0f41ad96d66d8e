"""LoopTurns spreads a burst of work over event-loop iterations, oldest first, within a budget."""

from __future__ import annotations

import asyncio

from streamvox.engine.loop_turns import LoopTurns


async def _iterations_of(turns: LoopTurns, costs: list[float], cancel: set[int] = frozenset()) -> list[int]:
    """Queue one waiter per cost; return the loop iteration (counted by a call_soon chain) each one ran in."""
    loop = asyncio.get_running_loop()
    iteration = 0
    running = True

    def tick() -> None:
        nonlocal iteration
        iteration += 1
        if running:
            loop.call_soon(tick)

    ran: list[int | None] = [None] * len(costs)

    async def worker(i: int, cost: float) -> None:
        await turns.wait(cost)
        ran[i] = iteration

    tasks = [asyncio.create_task(worker(i, cost)) for i, cost in enumerate(costs)]
    await asyncio.sleep(0)  # every worker is queued before the first grant
    for i in cancel:
        tasks[i].cancel()
    loop.call_soon(tick)
    await asyncio.gather(*tasks, return_exceptions=True)
    running = False
    return ran


def test_a_burst_is_spread_within_the_budget_in_order():
    turns = LoopTurns(budget_ms=2.0)
    ran = asyncio.run(_iterations_of(turns, [0.5] * 12))
    assert ran == sorted(ran), "turns are granted oldest first"
    per_iteration = [ran.count(i) for i in sorted(set(ran))]
    assert per_iteration == [4, 4, 4], per_iteration  # 4 x 0.5 ms fill a 2 ms budget


def test_an_expensive_turn_still_runs_and_cancelled_waiters_cost_nothing():
    turns = LoopTurns(budget_ms=2.0)
    ran = asyncio.run(_iterations_of(turns, [10.0, 0.5, 0.5, 0.5, 0.5, 0.5], cancel={1, 2}))
    assert ran[1] is None and ran[2] is None  # cancelled: never ran
    assert ran[0] < ran[3] == ran[4] == ran[5], ran  # the 10 ms turn alone, then the other three together

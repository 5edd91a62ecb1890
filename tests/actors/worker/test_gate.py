"""``SlotGate`` (decision 0049): slots go to the most urgent waiter first, in arrival order
within a priority, and a waiter cancelled (even as it is granted) loses no slot."""

from __future__ import annotations

import asyncio
import random

import pytest

from sojourn.actors.worker.gate import SlotGate


async def test_a_freed_slot_goes_to_the_most_urgent_waiter_then_in_arrival_order() -> None:
    gate = SlotGate(1)
    await gate.acquire(5)
    order: list[str] = []

    async def waiter(name: str, priority: int) -> None:
        await gate.acquire(priority)
        order.append(name)
        gate.release()

    tasks = []
    for name, p in [("bulk-a", 5), ("bulk-b", 5), ("normal", 3), ("urgent-a", 1), ("urgent-b", 1)]:
        tasks.append(asyncio.create_task(waiter(name, p)))
        await asyncio.sleep(0)  # each queues in turn
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["urgent-a", "urgent-b", "normal", "bulk-a", "bulk-b"]
    assert gate.free == 1


@pytest.mark.parametrize("seed", range(20))
async def test_cancelled_waiters_lose_no_slot(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    gate = SlotGate(n)
    held = 0

    async def user(priority: int) -> None:
        nonlocal held
        await gate.acquire(priority)
        held += 1
        try:
            assert held <= n
            await asyncio.sleep(rng.random() / 1000)
        finally:  # cancelled while holding: the slot goes back
            held -= 1
            gate.release()

    tasks = [asyncio.create_task(user(rng.randint(1, 5))) for _ in range(60)]
    for _ in range(20):
        await asyncio.sleep(rng.random() / 2000)
        rng.choice(tasks).cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert held == 0 and gate.free == n  # every slot back, none made
    await asyncio.wait_for(gate.acquire(3), timeout=1)  # and it still hands them out

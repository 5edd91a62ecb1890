"""The report printed near a test's hang guard: every running loop's tasks, alike ones once,
the project's own first."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import _dump_loop_tasks


async def _idle(q: asyncio.Queue[int]) -> None:
    await q.get()


async def _stuck_here(ev: asyncio.Event) -> None:
    await ev.wait()


async def test_the_report_names_the_stuck_await_first_and_groups_alike_tasks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    queues = [asyncio.Queue[int]() for _ in range(5)]
    idle = [asyncio.create_task(_idle(q), name=f"idle-{i}") for i, q in enumerate(queues)]
    ev = asyncio.Event()
    stuck = asyncio.create_task(_stuck_here(ev), name="the-stuck-one")
    library = asyncio.create_task(asyncio.sleep(3600), name="library-only")
    await asyncio.sleep(0)
    await asyncio.to_thread(_dump_loop_tasks, "a/test::id")  # as from the guard's thread
    ev.set()
    for q in queues:
        q.put_nowait(1)
    library.cancel()
    await asyncio.gather(stuck, *idle)
    err = capsys.readouterr().err
    assert "a/test::id: near its hang guard" in err
    blocks = err.split("\n--- ")[1:]
    names = [b.split("\n", 1)[0] for b in blocks]
    # The test's own task and the stuck one are in this file; the idle ones too, but alike.
    assert any(n.startswith("idle-") and n.endswith("and 4 more alike") for n in names)
    stuck_block = next(b for b in blocks if b.startswith("the-stuck-one"))
    assert "_stuck_here" in stuck_block and "Event.wait" in stuck_block
    assert sum("_idle" in b for b in blocks) == 1
    assert names.index("the-stuck-one") < names.index("library-only")  # ours first

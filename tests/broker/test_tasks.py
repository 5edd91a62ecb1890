"""Ending cancelled tasks: a cancel swallowed inside a library (``asyncio.wait_for`` in Python
3.11 returns a result that raced it) must not leave a stop waiting forever, nor the task
running on."""

from __future__ import annotations

import asyncio

from sojourn.broker.tasks import cancel_and_wait, reap, settle_cancelled


async def _swallows_cancels(lose: list[int], ended: list[str]) -> None:
    """A loop that loses its next ``lose[0]`` cancels, as one racing a completed reply does."""
    try:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lose[0] <= 0:
                    raise
                lose[0] -= 1
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
    finally:
        ended.append("ended")


async def test_a_task_that_swallows_a_cancel_is_cancelled_again_until_it_ends() -> None:
    ended: list[str] = []
    lose = [3]
    task = asyncio.create_task(_swallows_cancels(lose, ended))
    await asyncio.sleep(0.02)
    assert await cancel_and_wait(task, grace=5.0)
    assert task.cancelled() and ended == ["ended"] and lose == [0]


async def test_a_task_that_never_ends_is_left_after_the_grace_and_the_stop_goes_on() -> None:
    ended: list[str] = []
    lose = [10**9]
    task = asyncio.create_task(_swallows_cancels(lose, ended))
    await asyncio.sleep(0.02)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert not await cancel_and_wait(task, grace=0.3)
    assert loop.time() - began < 5.0 and not task.done() and lose[0] < 10**9
    lose[0] = 0  # it stops losing them: the next cancel ends it
    assert await cancel_and_wait(task, grace=5.0)
    assert ended == ["ended"]


async def test_settling_many_tasks_ends_each_and_retrieves_their_errors() -> None:
    async def fails() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("failed while cancelled") from None

    ended: list[str] = []
    tasks = [asyncio.create_task(_swallows_cancels([1], ended)), asyncio.create_task(fails())]
    await asyncio.sleep(0.02)
    await settle_cancelled(tasks, grace=5.0)
    assert all(t.done() for t in tasks) and ended == ["ended"]
    assert isinstance(tasks[1].exception(), RuntimeError)


async def test_nothing_to_cancel_is_done_at_once() -> None:
    assert await cancel_and_wait(None, grace=0.0)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    assert await cancel_and_wait(done, grace=0.0)


async def test_a_kills_reap_goes_on_cancelling_in_the_background_until_each_task_ends() -> None:
    ended: list[str] = []
    swallower = asyncio.create_task(_swallows_cancels([2], ended))
    plain = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0.02)
    reap([swallower, plain], grace=10.0)  # returns at once: a kill cannot wait
    assert not swallower.done()
    await asyncio.wait({swallower, plain}, timeout=10.0)
    # One cancel alone would have left the swallower running on (it loses two).
    assert swallower.cancelled() and plain.cancelled() and ended == ["ended"]

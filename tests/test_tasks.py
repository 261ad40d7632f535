"""Background tasks end when they are stopped, even when a cancellation is lost."""

from __future__ import annotations

import asyncio
import sys

from projections.tasks import stop_tasks


async def _sampler(answer: asyncio.Future[int], steps: list[int]) -> None:
    """A loop like the dashboard's sampler: each step awaits a request through
    ``wait_for`` (as nats-py does), then sleeps."""
    while True:
        fut = answer if not steps else asyncio.sleep(0.01, 1)
        steps.append(await asyncio.wait_for(fut, 10))


async def _lose_one_cancel() -> tuple[asyncio.Task[None], list[int]]:
    """A sampler whose first cancel arrives in the turn its answer does."""
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    steps: list[int] = []
    task = asyncio.create_task(_sampler(answer, steps))
    await asyncio.sleep(0)
    answer.set_result(0)
    task.cancel()
    return task, steps


async def test_a_single_cancel_can_be_lost_on_this_python() -> None:
    """Why stop_tasks exists: on 3.11 the sampler goes on after its cancel (on 3.12+,
    where wait_for was rewritten, the cancel holds and this documents nothing)."""
    task, steps = await _lose_one_cancel()
    await asyncio.sleep(0.05)
    if sys.version_info < (3, 12):
        assert not task.done() and len(steps) > 1  # it carried on sampling
    assert await stop_tasks([task], 2) == 0


async def test_stop_tasks_ends_a_task_that_lost_its_cancel() -> None:
    """The cancel is sent again until the task has ended."""
    task, _ = await _lose_one_cancel()
    assert await stop_tasks([task], 2) == 0
    assert task.done()


async def test_stop_tasks_gives_up_on_a_task_that_never_ends() -> None:
    """Bounded: a task that refuses every cancel is reported, not waited for forever."""
    stop = asyncio.Event()

    async def stubborn() -> None:
        while not stop.is_set():
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    assert await stop_tasks([task], 0.5) == 1
    stop.set()
    await stop_tasks([task], 2)
    assert task.done()

"""Running the engine on the caller's thread: no thread started, the caller's connection.

A workflow run is async and its steps' ORM work is sync, and that work must use the
caller's connection: the case lock it holds, its ``transaction.atomic`` block and, in tests,
the test transaction. Django keeps a thread's connection for code with no event loop
running, and gives code under a running loop a connection of its own (and refuses it
unless ``DJANGO_ALLOW_ASYNC_UNSAFE`` is set), so the engine's own ``asyncio.run`` cannot
carry that work. asgiref's ``async_to_sync`` with ``sync_to_async(thread_sensitive=True)``
can, but it starts a thread and an event loop for every run, and each ORM call hops to the
caller's thread and back; every hop waits for the other thread to be scheduled, which a
busy machine makes worse. Side by side (``python -m bench.driver``, docs/PERFORMANCE.md,
"The event-loop driver against asgiref"), a begin or a resume + approve + commit under
asgiref takes 1.1–1.4× the wall time and 1.25–1.33× the CPU it takes here, on SQLite and
on PostgreSQL.

``hosted`` runs the engine on an event loop of the calling thread (one per thread, kept for
its next run), and ``on_caller`` runs the steps' ORM work on that same thread *between*
loop iterations: the step queues the call and stops the loop, and the host makes the call
while no loop is running (so the connection is the thread's own and Django's async-safety
check holds), hands back the result and runs the loop again. ``run_on_caller`` is a run
whose calls the driver makes itself; a host that steps the run makes a call on its own
stack (workflow/answer.py hands the commit step's write to the decision service).

Outside a hosted run (a test driving ``workflow.run`` under ``async_to_sync`` itself),
``on_caller`` is ``sync_to_async(thread_sensitive=True)``: the same thread either way.

No agent-framework import here: the checkpoint store uses ``on_caller`` too.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from asgiref.sync import sync_to_async

_T = TypeVar("_T")


class _Driver:
    """One hosted run: its loop, and the sync calls its steps asked for."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.calls: collections.deque[Call] = collections.deque()


@dataclass(eq=False)
class Call:
    """A sync call a step asked for, waiting while the run's loop is stopped.

    ``run()`` makes it in the step's own context (as ``sync_to_async`` would); it is a
    ``functools.partial``, so whoever makes the call is the frame right under it. Its result
    or error goes back to the step with ``returned`` or ``raised``.
    """

    run: Callable[[], Any]
    future: asyncio.Future

    def returned(self, result: Any) -> None:
        if not self.future.cancelled():
            self.future.set_result(result)

    def raised(self, exc: BaseException) -> None:
        if not self.future.cancelled():
            self.future.set_exception(exc)

    def make(self) -> None:
        try:
            result = self.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the step that asked, as sync_to_async does
            self.raised(exc)
        else:
            self.returned(result)


_DRIVER: contextvars.ContextVar[_Driver | None] = contextvars.ContextVar("decisionflow_engine_driver", default=None)
_THREAD = threading.local()  # each thread's own loop, and whether a run is using it


async def on_caller(fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> _T:
    """Run ``fn(*args, **kwargs)`` on the calling thread, on its connection, and return its result."""
    driver = _DRIVER.get()
    loop = asyncio.get_running_loop()
    if driver is None or driver.loop is not loop:
        return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)
    future = loop.create_future()
    # The step's own context, as sync_to_async would run it.
    driver.calls.append(Call(functools.partial(contextvars.copy_context().run, fn, *args, **kwargs), future))
    loop.stop()  # the host makes the call once the loop has stopped, then runs it again
    return await future


class HostedRun(Generic[_T]):
    """A run on this thread's loop, stepped by its host: ``next_call`` runs the loop until a
    step asks for a sync call, which the host makes while the loop is stopped."""

    def __init__(self, driver: _Driver, task: asyncio.Task):
        self._driver, self._task = driver, task

    def next_call(self) -> Call | None:
        """The next call a step asked for; None once the run is done."""
        while not self._driver.calls:
            if self._task.done():
                return None
            self._driver.loop.run_forever()
        return self._driver.calls.popleft()

    def finish(self) -> _T:
        """Make every call the steps ask for, to the end of the run; the run's result."""
        while (call := self.next_call()) is not None:
            call.make()
        return self._task.result()


def _thread_loop() -> tuple[asyncio.AbstractEventLoop, bool]:
    """The thread's own loop; a fresh one, closed after, for a run nested in another run's
    sync call (the thread's loop is in use, stopped, by the outer run)."""
    if getattr(_THREAD, "busy", False):
        return asyncio.new_event_loop(), True
    loop = getattr(_THREAD, "loop", None)
    if loop is None or loop.is_closed():
        loop = _THREAD.loop = asyncio.new_event_loop()
    return loop, False


@contextmanager
def hosted(
    coroutine_fn: Callable[..., Coroutine[Any, Any, _T]], /, *args: Any, **kwargs: Any
) -> Iterator[HostedRun[_T]]:
    """``coroutine_fn(*args, **kwargs)`` as a run on this thread, for the block to step.

    Like ``async_to_sync``, refused in a thread where an event loop is running. Whatever the
    run left pending when the block ends is cancelled.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("the workflow cannot run in a thread with a running event loop; call it from another thread")
    loop, temporary = _thread_loop()
    driver = _Driver(loop)
    outer_busy = getattr(_THREAD, "busy", False)
    _THREAD.busy = True
    # The run's context: the caller's, plus the driver, which every step (and every task it
    # starts, as they copy it) sees; the caller's own context is left as it was.
    context = contextvars.copy_context()
    context.run(_DRIVER.set, driver)
    try:
        task = loop.create_task(coroutine_fn(*args, **kwargs), context=context)
        task.add_done_callback(lambda _: loop.stop())
        yield HostedRun(driver, task)
    finally:
        try:
            _cancel_leftovers(loop)
        finally:
            _THREAD.busy = outer_busy
            if temporary:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()


def run_on_caller(coroutine_fn: Callable[..., Coroutine[Any, Any, _T]], /, *args: Any, **kwargs: Any) -> _T:
    """Run ``coroutine_fn(*args, **kwargs)`` to completion on this thread and return its result,
    making every sync call its steps ask for."""
    with hosted(coroutine_fn, *args, **kwargs) as run:
        return run.finish()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel whatever the run left pending (as ``asyncio.run`` does), so that the next run
    on this loop starts clean."""
    leftovers = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))

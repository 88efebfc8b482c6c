"""The pop RPCs' store work: on the event loop, or joined in a worker thread.

Every PopMessages round, AckMessages and ChangeInvisibleDuration appends to
the pop journal, and a write may fsync it (always under SYNC_FLUSH; under
ASYNC_FLUSH the first write after ``flush_interval_commit_log_ms``) or
compact it. A worker thread hand-off costs more than the work itself when
the official clients ack one message per call (benchmarks/rocketmq_v2.py),
so :class:`PopWork` runs a call's work

* **on the event loop** when its write cannot block
  (:meth:`basalt.store.pop.PopStore.write_may_block`: one ``os.write`` into
  the page cache; the reads are page-cache reads, as a GetMessage's on the
  loop) and no batch is running in a thread (it holds the journal's lock);
* **in a worker thread** otherwise, the calls that arrive while a batch runs
  joined as the next batch: one thread hand-off and one
  :meth:`basalt.store.pop.PopStore.batch` - one journal write and at most
  one fsync for all of them - before any of them answers. The first such
  call goes at once (no added latency without concurrency).

A caller cancelled before its batch starts is left out (a pop nobody waits
for would leave its messages invisible until their time runs out); once the
batch runs, its work is done and its answer dropped. Each caller gets its
own result or exception. Concurrency: one event loop; the batches run in
the default executor, one at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from basalt.store.pop import PopStore

T = TypeVar("T")

#: Most calls' work in one batch (their records are one journal write).
MAX_BATCH = 64


class PopWork:
    """Joins the pop calls' store work over ``pops`` (module docstring)."""

    def __init__(self, pops: PopStore) -> None:
        self._pops = pops
        self._waiting: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._drain: asyncio.Task[None] | None = None
        #: Works run on the loop, batches run in a thread and works run in
        #: them, since start (tests, metrics).
        self.inline = 0
        self.batches = 0
        self.works = 0

    async def run(self, work: Callable[[], T]) -> T:
        """``work()``'s result (or its exception), run on the loop when its
        journal write cannot block, else in a worker thread in one batch with
        the other calls' work (module docstring)."""
        if self._drain is None and not self._pops.write_may_block():
            self.inline += 1
            return self._pops.batch(work)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting.append((work, future))
        if self._drain is None:
            self._drain = asyncio.create_task(self._run_batches())
        return await future

    async def _run_batches(self) -> None:
        try:
            while self._waiting:
                batch = [(w, f) for w, f in self._waiting[:MAX_BATCH] if not f.done()]
                del self._waiting[:MAX_BATCH]
                if not batch:
                    continue
                self.batches += 1
                self.works += len(batch)
                try:
                    outcomes = await asyncio.to_thread(self._pops.batch, partial(_each, batch))
                except Exception as e:  # the journal write failed: every caller is told
                    outcomes = [(False, e)] * len(batch)
                for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue  # its caller gave up meanwhile
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            self._drain = None


def _each(batch: list[tuple[Callable[[], Any], asyncio.Future[Any]]]) -> list[tuple[bool, Any]]:
    """Each work's (True, result) or (False, exception), in order (worker thread)."""
    out: list[tuple[bool, Any]] = []
    for work, _ in batch:
        try:
            out.append((True, work()))
        except Exception as e:
            out.append((False, e))
    return out

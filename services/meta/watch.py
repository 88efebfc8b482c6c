"""MetaWatcher: one etcd prefix mirrored into an in-memory dict.

The watcher lists the prefix (getting the store revision R of that read), then
watches it from R + 1, so no change between the list and the watch is missed
and none is applied twice. Each change replaces the cached value and fires the
change notifications. When the stream breaks (etcd down, restarted, or the
revision compacted) the cache keeps serving what it has, the outage is logged
once, and the watcher keeps retrying: a fresh list (which also catches deletes
made while it was away) and a watch from the new revision.

Reads (:meth:`get`, :meth:`snapshot`) never raise and never wait. A value that
does not decode (hand-edited JSON) is logged and the last good value for that
key, if any, keeps serving.

Concurrency: one background task on the loop that called :meth:`start`;
callbacks and waits happen on that loop. Callbacks are synchronous and must
not block; one that raises is logged and the others still run. :meth:`get`
and :meth:`snapshot` may also be called from other threads (the store's):
the cache dict is replaced, never mutated, so a reader sees a whole version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from basalt.common.tls import TlsConfig
from basalt.services.meta.config import MetaConfig
from basalt.services.meta.errors import MetaError, MetaUnavailableError
from basalt.services.meta.metrics import track as track_watcher
from basalt.services.meta.session import EtcdSession, EventKind, KeyValue

log = logging.getLogger(__name__)

T = TypeVar("T")

#: First pause before reconnecting; doubles up to config.reconnect_backoff_max_s.
_FIRST_BACKOFF_S = 0.1
#: How often a watcher checks how far its cache is behind etcd (:attr:`MetaWatcher.lag`).
LAG_CHECK_INTERVAL_S = 5.0


@dataclass(frozen=True, slots=True)
class MetaChange(Generic[T]):
    """One key's change as the cache saw it: ``old`` None for a new key, ``new``
    None for a deleted one."""

    name: str
    old: T | None
    new: T | None
    revision: int


class MetaWatcher(Generic[T]):
    """A live, read-only mirror of the keys under ``prefix``, keyed by the rest of the key.

    ``decode(name, raw)`` turns a value into ``T`` or raises MetaError. The
    watcher owns its etcd session (one gRPC channel), so a broken watch stream
    can be rebuilt without disturbing other users of the cluster.
    """

    def __init__(
        self,
        config: MetaConfig,
        prefix: str,
        decode: Callable[[str, bytes], T],
        *,
        what: str,
        lag_check_interval_s: float = LAG_CHECK_INTERVAL_S,
        tls: TlsConfig | None = None,
    ) -> None:
        if lag_check_interval_s <= 0:
            raise ValueError(f"lag_check_interval_s must be positive, not {lag_check_interval_s}")
        self.prefix = prefix
        self.what = what
        self._config = config
        self._decode = decode
        self._session = EtcdSession(config, tls=tls)
        self._data: dict[str, T] = {}
        self._revision = 0
        self._version = 0
        self._available = False
        self._synced = asyncio.Event()
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[MetaChange[T]], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._lag_task: asyncio.Task[None] | None = None
        self._lag_check_interval_s = lag_check_interval_s
        self._lag = 0
        self._closed = False
        track_watcher(self)

    # -- reads (never raise) ----------------------------------------------------------

    def get(self, name: str) -> T | None:
        return self._data.get(name)

    def snapshot(self) -> dict[str, T]:
        """A copy of every cached value; values are immutable."""
        return dict(self._data)

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __len__(self) -> int:
        return len(self._data)

    @property
    def synced(self) -> bool:
        """The prefix has been listed at least once."""
        return self._synced.is_set()

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    @property
    def available(self) -> bool:
        """The watch is live now (False while etcd is unreachable: values may be stale)."""
        return self._available

    @property
    def lag(self) -> int:
        """Revisions of the prefix etcd holds that the cache had not applied at the last
        check (every ``lag_check_interval_s`` while the watch is live; 0 when caught
        up): the newest key's mod_revision less the revision the cache reflects. A
        watch that stalls while etcd answers shows here; an outage shows in
        :attr:`available` (the value is kept from the last check). Deletions are not
        seen by the check (a deleted key has no mod_revision to list)."""
        return self._lag

    @property
    def revision(self) -> int:
        """The etcd revision the cache reflects."""
        return self._revision

    @property
    def version(self) -> int:
        """Counts applied changes; grows by at least one per notification."""
        return self._version

    # -- notifications ------------------------------------------------------------------

    def subscribe(self, callback: Callable[[MetaChange[T]], None]) -> Callable[[], None]:
        """Call ``callback`` for every change from now on; returns the unsubscribe function."""
        self._listeners.append(callback)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(callback)

        return unsubscribe

    async def wait_changed(self, timeout_s: float | None = None) -> bool:
        """Wait for the next change; False if ``timeout_s`` passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()
        except TimeoutError:
            return False
        return True

    async def wait_until(
        self, predicate: Callable[[Mapping[str, T]], bool], timeout_s: float
    ) -> bool:
        """Wait until ``predicate(cache)`` holds; False if it does not within ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate(self._data):
            left = deadline - loop.time()
            if left <= 0 or not await self.wait_changed(left):
                return predicate(self._data)
        return True

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, *, wait: bool = True) -> None:
        """Start the background task; with ``wait``, return once the prefix is listed.

        Raises MetaUnavailableError if that first listing does not happen within
        the operation timeout; the task keeps trying (call :meth:`close` to stop it).
        """
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name=f"basalt-watch:{self.prefix}")
            self._lag_task = loop.create_task(
                self._check_lag(), name=f"basalt-watch-lag:{self.prefix}"
            )
        if wait and not self._synced.is_set():
            try:
                async with asyncio.timeout(self._config.op_timeout_s):
                    await self._synced.wait()
            except TimeoutError as e:
                raise MetaUnavailableError(
                    self._config.endpoints, f"list {self.prefix}", e
                ) from None

    async def close(self) -> None:
        """Stop watching and close the session; the cache keeps its last values. Idempotent."""
        self._closed = True
        for task in (self._lag_task, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._lag_task = None
        self._available = False
        await self._session.close()

    # -- the loop -------------------------------------------------------------------------

    async def _check_lag(self) -> None:
        """Every ``lag_check_interval_s`` while the watch is live, measure :attr:`lag`
        (one one-key Range; never on a scrape's path)."""
        while not self._closed:
            await asyncio.sleep(self._lag_check_interval_s)
            if not self._available:
                continue  # the watch loop reports and recovers outages
            try:
                latest = await self._session.latest_mod_revision(self.prefix)
            except MetaError:
                continue
            self._lag = max(0, latest - self._revision)

    async def _run(self) -> None:
        backoff_s = _FIRST_BACKOFF_S
        outage = False
        while not self._closed:
            try:
                revision, kvs = await self._session.get_prefix(self.prefix)
                self._load(revision, kvs)
                self._available = True
                if outage:
                    log.info(
                        "%s: etcd reachable again, resynced at revision %d", self.what, revision
                    )
                outage = False
                backoff_s = _FIRST_BACKOFF_S
                events = self._session.watch_prefix(self.prefix, revision + 1)
                async with contextlib.aclosing(events):
                    async for event in events:
                        name = event.key[len(self.prefix) :]
                        if event.kind is EventKind.DELETE:
                            self._apply(name, None, event.mod_revision)
                        else:
                            self._apply(name, event.value, event.mod_revision)
            except MetaError as e:
                self._available = False
                if not outage:
                    log.warning(
                        "%s: %s; serving %d cached entries until it is back",
                        self.what,
                        e,
                        len(self._data),
                    )
                outage = True
            except Exception:
                self._available = False
                log.exception("%s: watch failed; retrying", self.what)
                outage = True
            # A fresh channel and watch stream for the next attempt (see services.meta.session).
            await self._session.reset()
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, self._config.reconnect_backoff_max_s)

    def _decoded(self, name: str, raw: bytes) -> T | None:
        """The value of ``name``, or its last good value if ``raw`` does not decode."""
        try:
            return self._decode(name, raw)
        except MetaError as e:
            log.warning("%s: ignoring %s%s: %s", self.what, self.prefix, name, e)
            return self._data.get(name)

    def _load(self, revision: int, kvs: list[KeyValue]) -> None:
        """Replace the cache with a fresh listing, notifying what differs."""
        fresh: dict[str, T] = {}
        for kv in kvs:
            name = kv.key[len(self.prefix) :]
            value = self._decoded(name, kv.value)
            if value is not None:
                fresh[name] = value
        old, self._data = self._data, fresh
        self._revision = revision
        changes = [
            MetaChange(name, old.get(name), fresh.get(name), revision)
            for name in sorted(old.keys() | fresh.keys())
            if old.get(name) != fresh.get(name)
        ]
        self._synced.set()
        self._notify(changes)

    def _apply(self, name: str, raw: bytes | None, revision: int) -> None:
        old = self._data.get(name)
        new = None if raw is None else self._decoded(name, raw)
        # Copy-on-write: a reader in another thread always sees a whole dict.
        data = dict(self._data)
        if new is None:
            data.pop(name, None)
        else:
            data[name] = new
        self._data = data
        self._revision = revision
        if old != new:
            self._notify([MetaChange(name, old, new, revision)])

    def _notify(self, changes: list[MetaChange[T]]) -> None:
        if not changes:
            return
        self._version += len(changes)
        for change in changes:
            for listener in list(self._listeners):
                try:
                    listener(change)
                except Exception:
                    log.exception("%s: change listener failed on %s", self.what, change.name)
        # Wake every waiter, then arm a fresh event for the next change.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

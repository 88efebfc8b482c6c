"""The failure channel: a background service's fatal error as the store's state.

Kafka's LogDirFailureChannel: an I/O error in any log thread marks the log
directory offline, and the broker stops acknowledging writes it can no longer
make durable instead of carrying on as if nothing happened. Here, every
background service of a :class:`~basalt.store.message_store.MessageStore`
(the CommitLog flush, group commit, the dispatcher, the ConsumeQueue flush,
expiry, offset persistence) reports an error it cannot recover from to the
store's one :class:`FailureChannel`. From the first record on the store
refuses sends (SERVICE_NOT_AVAILABLE, naming the service and the error) and
says it is unhealthy; reads of what is already stored keep working. Only a
restart, whose recovery decides what is valid, clears it.

Concurrency: :meth:`FailureChannel.record` is called from any thread; the
hot path reads :attr:`FailureChannel.first` without a lock (one attribute
load of an immutable record).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StoreFailure:
    """One service's fatal failure: which service, the error, when (Unix ms)."""

    service: str
    error: BaseException
    at_ms: int

    def describe(self) -> str:
        """``"<service> failed: <ErrorType>: <error>"``: the reason a refused send carries."""
        return f"{self.service} failed: {type(self.error).__name__}: {self.error}"


#: Told every newly recorded failure, on the thread that recorded it: must be
#: quick, thread-safe and must not raise (e.g. ``loop.call_soon_threadsafe``).
FailureListener = Callable[[StoreFailure], None]


class FailureChannel:
    """The first fatal failure of each service of one store; never cleared."""

    def __init__(self, now_ms: Callable[[], int] | None = None) -> None:
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._by_service: dict[str, StoreFailure] = {}
        self._listeners: list[FailureListener] = []
        #: The earliest failure recorded (None while healthy): what sends are refused with.
        self.first: StoreFailure | None = None

    def record(self, service: str, error: BaseException) -> StoreFailure:
        """Record ``service``'s failure (only its first counts: a service that failed
        is stopped, and a later error of it is a consequence); logs it at ERROR
        with its traceback and tells the listeners. Returns the kept record."""
        with self._lock:
            kept = self._by_service.get(service)
            if kept is not None:
                return kept
            kept = self._by_service[service] = StoreFailure(service, error, self._now_ms())
            if self.first is None:
                self.first = kept
            listeners = list(self._listeners)
        log.error(
            "%s: sends are refused until the store is restarted",
            kept.describe(),
            exc_info=(type(error), error, error.__traceback__),
        )
        for listener in listeners:
            try:
                listener(kept)
            except Exception:
                # A listener must not turn one failure into two (it runs on the
                # failed service's thread, which is about to stop anyway).
                log.exception("a store failure listener raised")
        return kept

    @property
    def failures(self) -> list[StoreFailure]:
        """Every service's failure, in the order they were recorded."""
        with self._lock:
            return list(self._by_service.values())

    def subscribe(self, listener: FailureListener) -> None:
        """Tell ``listener`` every failure from now on, and at once the first one
        if the store has already failed (so no failure falls between a check
        and the subscription)."""
        with self._lock:
            self._listeners.append(listener)
            first = self.first
        if first is not None:
            listener(first)

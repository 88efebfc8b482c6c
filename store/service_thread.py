"""The background threads' common shape (RocketMQ's ServiceThread)."""

from __future__ import annotations

import abc
import logging
import threading

from basalt.store.failures import FailureChannel

log = logging.getLogger(__name__)


class ServiceThread(abc.ABC):
    """A named daemon thread with a wake-up event and a stop flag.

    An exception escaping :meth:`run` stops the service for good: it is
    recorded in ``failures`` (the store's :class:`FailureChannel`, which then
    refuses sends) and logged at ERROR with its traceback. A service without
    a channel (a test's, a tool's) only logs it.
    """

    name = "service"

    def __init__(self) -> None:
        self._wakeup = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: Where a fatal error is recorded; set by the owner before :meth:`start`.
        self.failures: FailureChannel | None = None

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._guarded_run, name=self.name, daemon=True)
        self._thread.start()

    def _guarded_run(self) -> None:
        try:
            self.run()
        except Exception as e:
            self.fail(e)

    def fail(self, error: BaseException) -> None:
        """Record ``error`` as this service's fatal failure (logged at ERROR)."""
        if self.failures is not None:
            self.failures.record(self.name, error)
        else:
            log.error("%s failed", self.name, exc_info=(type(error), error, error.__traceback__))

    @abc.abstractmethod
    def run(self) -> None:
        """The thread's body; returns once ``_stopping`` is set and its work is done."""

    def wakeup(self) -> None:
        self._wakeup.set()

    def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

"""The background threads' common shape (RocketMQ's ServiceThread)."""

from __future__ import annotations

import abc
import logging
import threading

log = logging.getLogger(__name__)


class ServiceThread(abc.ABC):
    """A named daemon thread with a wake-up event and a stop flag."""

    name = "service"

    def __init__(self) -> None:
        self._wakeup = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._guarded_run, name=self.name, daemon=True)
        self._thread.start()

    def _guarded_run(self) -> None:
        try:
            self.run()
        except Exception:
            log.exception("%s crashed", self.name)

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

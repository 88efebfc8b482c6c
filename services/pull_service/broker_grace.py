"""RegisteredBrokers: the broker lookups of a pull-service, forgiving a brief deletion.

A store-node's ``brokers/<name>`` key lives under its lease. When etcd stalls
for longer than the lease TTL (a paused or overloaded etcd, a long fsync),
etcd expires the lease on waking and deletes the key; the store-node, which
never stopped, notices at its next keepalive and puts the key again under a
new lease, tens of milliseconds to about ``ttl / 3`` later. A pull-service
reading the raw watch cache refuses every pull in that gap with
BROKER_NOT_EXIST ("broker 'broker-a' is not registered").

RocketMQ clients keep a route they hold for a while rather than dropping it
at the first bad answer; the pull-service does the same here.
:meth:`RegisteredBrokers.get` answers, for a broker name::

    registered now                              its registration (the newest put)
    deleted at t, not put since, now < t + grace    the registration it had before
    otherwise (never seen, or deleted >= grace ago) None

A store-node that really died therefore stays routable for ``grace_s``: its
pulls fail with the pull-service's accurate "store-node ... is unreachable"
(SERVICE_NOT_AVAILABLE) rather than "not registered", and after the grace it
is gone as before. ``grace_s`` should exceed the gap a live store-node needs
to re-register: its lease TTL plus a second is ample.

Time is the injected monotonic clock ``monotonic_s`` (seconds), read when the
deletion is seen and on each :meth:`get`.

Concurrency: call everything on the watcher's event loop (its change
notifications run there, and :meth:`get` reads the watcher and the departed
brokers as one step only on that loop).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from basalt.services.meta.model import BrokerRegistration
from basalt.services.meta.watch import MetaChange, MetaWatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Departed:
    """A broker whose key was deleted: its last registration and when the delete was seen."""

    registration: BrokerRegistration
    deleted_at_s: float


class RegisteredBrokers:
    """The brokers of ``watcher``, each kept for ``grace_s`` after its key is
    deleted (the module's table). Subscribes to ``watcher`` at construction;
    :meth:`close` unsubscribes. Starting and closing ``watcher`` stays its
    owner's job; a deletion is tracked whether the watcher saw it in its watch
    stream or in the fresh listing after an etcd outage.
    """

    def __init__(
        self,
        watcher: MetaWatcher[BrokerRegistration],
        *,
        grace_s: float,
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        if not grace_s >= 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self.grace_s = grace_s
        self._watcher = watcher
        self._monotonic_s = monotonic_s
        self._departed: dict[str, _Departed] = {}
        self._unsubscribe: Callable[[], None] | None = watcher.subscribe(self._on_change)

    def get(self, name: str) -> BrokerRegistration | None:
        """The registration of broker ``name`` by the module's table; never raises.

        Has the shape of ``check_pull``'s and ``topic_route``'s ``broker_of``.
        """
        registration = self._watcher.get(name)
        if registration is not None:
            return registration
        departed = self._departed.get(name)
        if departed is None or self._expired(departed, self._monotonic_s()):
            return None
        return departed.registration

    def close(self) -> None:
        """Stop following the watcher and forget departed brokers: :meth:`get`
        then answers what the watcher holds. Idempotent."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._departed.clear()

    def _expired(self, departed: _Departed, now_s: float) -> bool:
        return now_s - departed.deleted_at_s >= self.grace_s

    def _on_change(self, change: MetaChange[BrokerRegistration]) -> None:
        now_s = self._monotonic_s()
        # Forget what outlived its grace, so the dict holds only recent departures.
        for name in [n for n, d in self._departed.items() if self._expired(d, now_s)]:
            del self._departed[name]
        if change.new is not None:
            if self._departed.pop(change.name, None) is not None:
                log.info("broker %r registered again", change.name)
        elif change.old is not None:
            self._departed[change.name] = _Departed(change.old, now_s)
            log.info(
                "broker %r: registration deleted; still routing to %s for %.1f s "
                "in case it registers again",
                change.name,
                change.old.address,
                self.grace_s,
            )

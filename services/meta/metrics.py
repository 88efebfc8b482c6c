"""etcd reachability as an OpenTelemetry gauge, for every service that uses etcd.

``basalt.etcd.reachable`` is 1 while a :class:`~basalt.services.meta.watch.MetaWatcher`'s
watch is live and 0 while etcd is unreachable (the cache then serves stale
values), one series per watcher (``basalt.etcd.watch``: what it mirrors, e.g.
``topic cache``; ``basalt.etcd.prefix``: its key prefix), and
``basalt.etcd.watch.lag``, the revisions under the prefix the cache had not
applied at its last check (:attr:`MetaWatcher.lag`, measured by the watcher
every few seconds, never by a scrape). Every watcher made
in the process is tracked weakly from its construction until it is closed;
the callback reads one attribute of each (the exporter's thread, no network).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation


class _Watch(Protocol):
    what: str
    prefix: str

    @property
    def available(self) -> bool: ...

    @property
    def lag(self) -> int: ...

    @property
    def closed(self) -> bool: ...


_watchers: weakref.WeakSet[Any] = weakref.WeakSet()


def track(watcher: _Watch) -> None:
    """Report ``watcher``'s reachability until it is closed or collected."""
    _watchers.add(watcher)


def _each(value: Callable[[_Watch], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """A gauge callback observing ``value(watcher)`` for every open watcher."""

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(value(w), {"basalt.etcd.watch": w.what, "basalt.etcd.prefix": w.prefix})
            for w in list(_watchers)
            if not w.closed
        ]

    return observe


_meter = metrics.get_meter("basalt.services.meta")
_meter.create_observable_gauge(
    "basalt.etcd.reachable",
    [_each(lambda w: 1 if w.available else 0)],
    unit="1",
    description="1 while a watch of etcd is live, 0 while etcd is unreachable.",
)
_meter.create_observable_gauge(
    "basalt.etcd.watch.lag",
    [_each(lambda w: w.lag)],
    unit="{revision}",
    description="Revisions etcd holds under the watched prefix that the cache had not "
    "applied at its last check (0: caught up).",
)

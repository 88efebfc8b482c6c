"""etcd reachability as an OpenTelemetry gauge, for every service that uses etcd.

``basalt.etcd.reachable`` is 1 while a :class:`~basalt.services.meta.watch.MetaWatcher`'s
watch is live and 0 while etcd is unreachable (the cache then serves stale
values), one series per watcher (``basalt.etcd.watch``: what it mirrors, e.g.
``topic cache``; ``basalt.etcd.prefix``: its key prefix). Every watcher made
in the process is tracked weakly from its construction until it is closed;
the callback reads one attribute of each (the exporter's thread, no network).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation


class _Watch(Protocol):
    what: str
    prefix: str

    @property
    def available(self) -> bool: ...

    @property
    def closed(self) -> bool: ...


_watchers: weakref.WeakSet[Any] = weakref.WeakSet()


def track(watcher: _Watch) -> None:
    """Report ``watcher``'s reachability until it is closed or collected."""
    _watchers.add(watcher)


def _reachable(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(
            1 if w.available else 0, {"basalt.etcd.watch": w.what, "basalt.etcd.prefix": w.prefix}
        )
        for w in list(_watchers)
        if not w.closed
    ]


metrics.get_meter("basalt.services.meta").create_observable_gauge(
    "basalt.etcd.reachable",
    [_reachable],
    unit="1",
    description="1 while a watch of etcd is live, 0 while etcd is unreachable.",
)

"""The pull-service's OpenTelemetry metrics and its per-call spans (API only).

* ``basalt.pull.duration`` (s, histogram): one Pull or PullBatch call, a held
  long poll included (``basalt.pull.call``: ``Pull`` / ``PullBatch``), bucketed
  by :data:`basalt.services.histograms.DURATION_BUCKETS_S`;
* ``basalt.pull.batch.queues`` ({queue}, histogram): queues per PullBatch;
* ``basalt.pull.held`` ({request}, up-down counter): calls waiting on a
  store-node with a suspend timeout (held long polls);
* ``basalt.pull.sessions`` ({session}, observable gauge): consumer sessions
  open on each pull-service (``basalt.pull_service.id``);
* ``basalt.pull.records.damaged`` ({record}, counter): stored records a
  decoding read left out because their checksum failed (``basalt.pull.call``:
  ``Pull`` / ``PullBatch`` with ``decode``, the RocketMQ 5 front's
  ``ReceiveMessage`` / ``PullMessage`` / ``ForwardMessageToDeadLetterQueue``;
  ``messaging.destination.name``), each also logged at ERROR
  (:func:`damaged_records`).

Messages and bytes got are counted by the store-node, per topic
(``basalt.store.get.*``): a PullBatch passes the store-node's answer through
undecoded, and decoding it to count would be most of the call's work.

One span per call (never per message), its attributes set only when
it is recorded. Sessions are read at collection from the in-memory registry.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from basalt.common.record import DamagedRecord
from basalt.services.histograms import duration_histogram

log = logging.getLogger(__name__)

_meter = metrics.get_meter("basalt.services.pull_service")
_tracer = trace.get_tracer("basalt.services.pull_service")

_duration = duration_histogram(
    _meter, "basalt.pull.duration", "One Pull or PullBatch call, held time included."
)
_batch_queues = _meter.create_histogram(
    "basalt.pull.batch.queues", unit="{queue}", description="Queues read by one PullBatch."
)
_damaged = _meter.create_counter(
    "basalt.pull.records.damaged",
    unit="{record}",
    description="Stored records left out of a decoded answer: their checksum failed.",
)
#: Pull calls now waiting with a suspend timeout (the event loop's; read at collection).
_held_now = 0
_CALLS = {name: {"basalt.pull.call": name} for name in ("Pull", "PullBatch")}

#: pull-service id → its session registry (anything with ``__len__``), weakly.
_registries: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def track_sessions(pull_service_id: str, sessions: Any) -> None:
    """Report ``len(sessions)`` as this pull-service's open consumer sessions."""
    _registries[pull_service_id] = sessions


@contextmanager
def pull_call(name: str, queues: int, group: str, suspend_ms: int) -> Iterator[None]:
    """Measure one Pull/PullBatch call of ``queues`` queues: its span, its duration,
    and, while it may be held (``suspend_ms`` > 0), the held count."""
    global _held_now
    attrs = _CALLS[name]
    if name == "PullBatch":
        _batch_queues.record(queues)
    started = time.perf_counter()
    held = suspend_ms > 0
    _held_now += held
    try:
        # A span of its own only under a recorded (sampled) gRPC span: an
        # unsampled call costs no span.
        if trace.get_current_span().is_recording():
            with _tracer.start_as_current_span(name) as span:
                span.set_attribute("messaging.system", "rocketmq")
                span.set_attribute("messaging.consumer.group.name", group)
                span.set_attribute("basalt.queue.count", queues)
                yield
        else:
            yield
    finally:
        _held_now -= held
        _duration.record(time.perf_counter() - started, attrs)


def _sessions(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(len(registry), {"basalt.pull_service.id": pid})
        for pid, registry in list(_registries.items())
    ]


_meter.create_observable_gauge(
    "basalt.pull.held",
    [lambda options: [Observation(_held_now)]],
    unit="{request}",
    description="Pull calls held waiting for messages.",
)
_meter.create_observable_gauge(
    "basalt.pull.sessions",
    [_sessions],
    unit="{session}",
    description="Consumer sessions open on the pull-service.",
)


def damaged_records(call: str, broker: str, damaged: Iterable[DamagedRecord]) -> None:
    """Report records ``call`` left out of its answer (read from ``broker``)
    because their checksum failed: each logged at ERROR with its offsets, and
    counted. Never data: the caller has already left them out."""
    for d in damaged:
        log.error("%s: broker %s: %s", call, broker, d.describe())
        _damaged.add(1, {"basalt.pull.call": call, "messaging.destination.name": d.topic})

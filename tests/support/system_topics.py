"""What the tests of the store's system-topic services share (delay levels,
timers: docs/scheduled.md, docs/timers.md): waiting for the dispatch, reading a
queue back, a timer message, and a timer driven by hand."""

from __future__ import annotations

from basalt.common.message import (
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
    Message,
    MessageRecord,
)
from basalt.store import ManualClock, MessageStore
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory


def dispatched(store: MessageStore) -> None:
    """Wait until the dispatcher has caught up with the CommitLog."""
    eventually_sync(
        lambda: store.dispatcher.reput_from_offset == store.max_physical_offset,
        what="dispatch to catch up",
    )


def real(store: MessageStore, topic: str, queue_id: int = 0) -> list[MessageRecord]:
    """Every record of one queue, once dispatched."""
    dispatched(store)
    return [r for _, r in store.iter_queue(topic, queue_id)]


def open_timer_store(
    make_config: ConfigFactory, clock: ManualClock, **overrides: object
) -> MessageStore:
    """A started store whose timer thread is stopped (driven by hand: :func:`step`)."""
    store = MessageStore.open(make_config(**overrides), clock=clock)
    store.timer.stop_thread()
    return store


def step(store: MessageStore) -> None:
    """One round of the timer's thread, after the dispatch caught up."""
    dispatched(store)
    store.timer.run_once()


def timer_message(topic: str, body: bytes, deliver_ms: int, uniq: str, **kw: object) -> Message:
    """A message asking for delivery at ``deliver_ms`` (TIMER_DELIVER_MS)."""
    return Message(
        topic,
        body,
        properties={PROPERTY_TIMER_DELIVER_MS: str(deliver_ms), PROPERTY_UNIQ_KEY: uniq},
        **kw,  # type: ignore[arg-type]
    )

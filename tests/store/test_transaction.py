"""store.transaction over a real store: the half and committed messages' shapes,
the check walk (young halves wait, old ones re-put with a count, progress kept
as CID_SYS_RMQ_TRANS's offset, check max to TRANS_CHECK_MAX_TIME_TOPIC), the
resolutions read again after a restart, and a commit whose op mark was lost
(the window a torn append leaves) not delivered twice."""

from __future__ import annotations

from pathlib import Path

from basalt.common.message import (
    TRANS_CHECK_GROUP,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    Message,
    new_uniq_key,
    transaction_type,
)
from basalt.store import ManualClock, MessageStore
from basalt.store.put_result import PutStatus
from basalt.store.transaction import (
    EndPlan,
    HalfCheck,
    Resolution,
    TransactionalMessageService,
    committed_message,
    half_message,
)
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory

TOPIC = "Orders"
GROUP = "PG"


def dispatched(store: MessageStore) -> None:
    eventually_sync(
        lambda: store.dispatcher.reput_from_offset == store.max_physical_offset,
        what="dispatch to catch up",
    )


def put_half(store: MessageStore, body: bytes, clock: ManualClock) -> tuple[int, str]:
    """A half stored; returns (its physical offset, its transaction id)."""
    uniq = new_uniq_key()
    message = Message(
        TOPIC,
        body,
        queue_id=2,
        tags="T",
        keys=("k1",),
        properties={"UNIQ_KEY": uniq, "PGROUP": GROUP, "TRAN_MSG": "true"},
        born_timestamp_ms=clock.now_ms(),
    )
    result = store.put_messages([half_message(message)])
    assert result.status is PutStatus.PUT_OK
    dispatched(store)
    return result.physical_offsets[0], uniq


def end(service: TransactionalMessageService, phy: int, uniq: str, how: Resolution) -> EndPlan:
    plan = service.plan_end(phy, uniq, GROUP, how)
    result = service.store.put_messages(plan.messages) if plan.messages else None
    service.finish_end(plan, result)
    return plan


def delivered(store: MessageStore) -> list[bytes]:
    dispatched(store)
    out = []
    for q in range(4):
        for offset in range(store.get_max_offset_in_queue(TOPIC, q)):
            record = store.get_message_by_queue_offset(TOPIC, q, offset)
            assert record is not None
            out.append(record.body)
    return out


def test_a_half_is_parked_and_its_commit_is_the_producers_message(
    make_config: ConfigFactory,
) -> None:
    clock = ManualClock()
    with MessageStore.open(make_config(), clock=clock) as store:
        phy, uniq = put_half(store, b"body", clock)
        half = store.lookup_message_by_offset(phy)
        assert half is not None
        assert (half.topic, half.queue_id) == (TRANS_HALF_TOPIC, 0)
        assert half.properties["REAL_TOPIC"] == TOPIC and half.properties["REAL_QID"] == "2"
        assert store.get_max_offset_in_queue(TOPIC, 2) == 0
        real = committed_message(half)
        assert (real.topic, real.queue_id, real.body) == (TOPIC, 2, b"body")
        assert real.properties["UNIQ_KEY"] == uniq and real.properties["TAGS"] == "T"
        assert real.properties["KEYS"] == "k1"
        assert not {"REAL_TOPIC", "REAL_QID", "TRAN_MSG"} & real.properties.keys()
        assert transaction_type(real.sys_flag) == TRANSACTION_COMMIT_TYPE
        assert real.prepared_transaction_offset == phy
        assert real.born_timestamp_ms == half.born_timestamp_ms


def test_the_check_walk_waits_for_young_halves_rechecks_old_ones_then_gives_up(
    make_config: ConfigFactory,
) -> None:
    clock = ManualClock()
    with MessageStore.open(make_config(), clock=clock) as store:
        service = TransactionalMessageService(store, now_ms=clock.now_ms)
        service.load()
        phy_done, tx_done = put_half(store, b"done", clock)
        phy_open, tx_open = put_half(store, b"open", clock)
        end(service, phy_done, tx_done, Resolution.COMMIT)
        dispatched(store)
        asked: list[HalfCheck] = []

        def walk(listening: bool = True) -> None:
            service.check_round(
                timeout_ms=6_000,
                check_max=2,
                listening=lambda group: listening and group == GROUP,
                ask=asked.append,
            )
            dispatched(store)

        clock.advance(1_000)
        walk()  # young: nothing asked, the progress stays at the first unresolved
        assert asked == [] and service.half_progress() == 1
        clock.advance(6_000)
        walk(listening=False)  # nobody listens: re-put, not counted, progress moves
        assert asked == [] and service.half_progress() == 2
        clock.advance(1)
        walk()
        assert [(c.transaction_id, c.check_times) for c in asked] == [(tx_open, 1)]
        # The progress is CID_SYS_RMQ_TRANS's offset: past the copy it walked.
        assert store.query_offset(TRANS_CHECK_GROUP, TRANS_HALF_TOPIC, 0) == 3
        clock.advance(1)
        walk()
        assert [c.check_times for c in asked] == [1, 2]
        clock.advance(1)
        walk()  # checked twice = transaction_check_max: given up on
        assert len(asked) == 2
        parked = store.get_message_by_queue_offset(TRANS_CHECK_MAX_TIME_TOPIC, 0, 0)
        assert parked is not None and parked.body == b"open"
        # Rolled back with it: a late commit puts nothing.
        assert end(service, phy_open, tx_open, Resolution.COMMIT).messages == ()
        assert delivered(store) == [b"done"]
        assert store.get_max_offset_in_queue(TRANS_OP_HALF_TOPIC, 0) == 2


def test_resolutions_survive_a_restart_and_a_lost_op_mark_is_not_a_second_commit(
    make_config: ConfigFactory, tmp_path: Path
) -> None:
    clock = ManualClock()
    config = make_config()
    with MessageStore.open(config, clock=clock) as store:
        service = TransactionalMessageService(store, now_ms=clock.now_ms)
        service.load()
        phy_rolled, tx_rolled = put_half(store, b"rolled", clock)
        end(service, phy_rolled, tx_rolled, Resolution.ROLLBACK)
        # The torn-append window: the real message stored, its op mark not.
        phy_torn, tx_torn = put_half(store, b"torn", clock)
        half = store.lookup_message_by_offset(phy_torn)
        assert half is not None
        assert store.put_messages([committed_message(half)]).status is PutStatus.PUT_OK
        assert delivered(store) == [b"torn"]
    clock.advance(10)
    with MessageStore.open(config, clock=clock) as store:
        service = TransactionalMessageService(store, now_ms=clock.now_ms)
        assert service.load() == 1
        assert service.resolved(tx_rolled) is Resolution.ROLLBACK
        again = end(service, phy_rolled, tx_rolled, Resolution.ROLLBACK)
        assert again.messages == () and again.done is Resolution.ROLLBACK
        # The check-back's COMMIT finds the committed record by its UNIQ_KEY: mark only.
        plan = end(service, phy_torn, tx_torn, Resolution.COMMIT)
        assert [m.topic for m in plan.messages] == [TRANS_OP_HALF_TOPIC]
        assert delivered(store) == [b"torn"]
        assert service.resolved(tx_torn) is Resolution.COMMIT

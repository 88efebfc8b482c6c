"""Consumer offsets through the MessageStore: persistence across restarts, reset by time."""

from __future__ import annotations

import json

from basalt.store import ManualClock, Message, MessageStore
from basalt.store.consumer_offsets import CommitStatus
from tests.support.stores import ConfigFactory

TOPIC = "Offsets"


def test_offsets_survive_a_restart_in_rocketmqs_file(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config()
    with MessageStore.open(config, clock=clock) as store:
        assert store.query_offset("G", TOPIC, 0) == -1
        assert store.commit_offset("G", TOPIC, 0, 12).ok
        assert store.commit_offset("G", TOPIC, 1, 7).ok
    doc = json.loads((config.config_dir / "consumerOffset.json").read_text())
    assert doc["offsetTable"] == {f"{TOPIC}@G": {"0": 12, "1": 7}}
    with MessageStore.open(config, clock=clock) as store:
        assert store.query_offset("G", TOPIC, 0) == 12
        assert store.query_offset("G", TOPIC, 1) == 7


def test_reset_by_time_stores_offsets_bumps_the_epoch_and_fences_old_commits(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config()
    base = clock.now_ms()
    with MessageStore.open(config, clock=clock) as store:
        for i in range(20):
            clock.set(base + i * 1000)
            assert store.put_message(Message(TOPIC, b"%d" % i, queue_id=i % 2)).ok
        assert store.wait_dispatched()
        assert store.commit_offset("G", TOPIC, 0, 8).ok
        assert store.commit_offset("G", TOPIC, 1, 1).ok
        # Back to message 6's time: queue 0 offset 3; on queue 1 the nearer of
        # messages 5 and 7 (a tie: the earlier, offset 2) - but queue 1 is already
        # at 1, earlier still, and without force it keeps its committed offset.
        table, epoch = store.reset_offset_by_time("G", TOPIC, [0, 1], base + 6000, force=False)
        assert table == {0: 3, 1: 1}
        assert epoch == 1
        assert store.query_offset("G", TOPIC, 0) == 3
        stale = store.commit_offset("G", TOPIC, 0, 9, reset_epoch=0)
        assert stale.status is CommitStatus.STALE_RESET_EPOCH
        assert store.query_offset("G", TOPIC, 0) == 3
        assert store.commit_offset("G", TOPIC, 0, 4, reset_epoch=1).ok
        forced, epoch2 = store.reset_offset_by_time("G", TOPIC, [0, 1], base + 6000, force=True)
        assert forced == {0: 3, 1: 2}
        assert epoch2 == 2
        latest, _ = store.reset_offset_by_time("G", TOPIC, [0, 1], -1, force=True)
        assert latest == {0: 10, 1: 10}
    # The reset was written before it returned: a kill -9 cannot lose it.
    doc = json.loads((config.config_dir / "consumerOffset.json").read_text())
    assert doc["resetEpochTable"] == {f"{TOPIC}@G": 3}

"""The queue manifest (:mod:`basalt.store.queue_manifest`): its bytes, its damage,
and when a store writes it.

What recovery does with it (a lost queue directory, records the CommitLog no
longer holds) is tests/store/test_lost_queues.py's.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from basalt.store import ManualClock, Message, MessageStore
from basalt.store.queue_manifest import (
    MANIFEST_INTERVAL_MS,
    MAX_QUEUE_ID,
    MAX_QUEUE_OFFSET,
    ManifestDamage,
    ManifestStatus,
    QueueManifest,
    decode_manifest,
    encode_manifest,
    manifest_path,
)
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory

topics = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1)
tables = st.dictionaries(
    st.tuples(topics, st.integers(0, MAX_QUEUE_ID)), st.integers(1, MAX_QUEUE_OFFSET), max_size=20
)


@given(tables)
def test_a_table_round_trips(table: dict[tuple[str, int], int]) -> None:
    assert decode_manifest(encode_manifest(table)) == table


def test_the_file_is_one_json_line_a_reader_can_use() -> None:
    data = encode_manifest({("T", 1): 748, ("T", 0): 750, ("Empty", 0): 0})
    assert data == b'{"version":1,"crc32":"%s","queues":{"T":{"0":750,"1":748}}}\n' % (data[22:30])
    assert json.loads(data) == {
        "version": 1,
        "crc32": data[22:30].decode(),
        "queues": {"T": {"0": 750, "1": 748}},
    }


def test_every_flipped_bit_and_every_cut_is_detected() -> None:
    data = encode_manifest({("TopicTest", 0): 750, ("TopicTest", 1): 12, ("%RETRY%g", 0): 3})
    for pos in range(len(data) - 1):  # the last byte is the newline a reader strips
        for bit in range(8):
            damaged = bytearray(data)
            damaged[pos] ^= 1 << bit
            with pytest.raises(ManifestDamage):
                decode_manifest(bytes(damaged))
    for cut in range(len(data) - 1):
        with pytest.raises(ManifestDamage):
            decode_manifest(data[:cut])


@pytest.mark.parametrize(
    "body",
    [
        b'["not","a","table"]',
        b'{"T":{"zero":1}}',
        b'{"T":{"0":1.5}}',
        b'{"T":{"0":-3}}',
        b'{"T":{"-1":3}}',
        b'{"T":{"0":"3"}}',
        b'{"":{"0":3}}',
        b'{"T":{"0":%d}}' % (1 << 62),
    ],
)
def test_a_crc_valid_file_that_is_no_table_of_offsets_is_damage(body: bytes) -> None:
    """What the store never writes, even with a right CRC, is refused: an offset
    recovery would act on must be one a queue can have."""
    data = b'{"version":1,"crc32":"%08x","queues":%s}' % (zlib.crc32(body), body)
    with pytest.raises(ManifestDamage):
        decode_manifest(data)


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda p: p.write_bytes(b"\0" * 4096), id="zeroed"),
        pytest.param(lambda p: p.write_bytes(b'{"version":2}'), id="another-version"),
        pytest.param(lambda p: p.mkdir(), id="a-folder"),
    ],
)
def test_a_damaged_manifest_loads_as_damaged_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, spoil: Callable[[Path], object]
) -> None:
    path = tmp_path / "m.json"
    spoil(path)
    with caplog.at_level(logging.ERROR):
        got = QueueManifest(path).load()
    assert got.status is ManifestStatus.DAMAGED and got.maxima == {}
    assert "ignored" in got.describe() and "ignored" in caplog.text


def test_a_missing_manifest_loads_as_missing(tmp_path: Path) -> None:
    got = QueueManifest(tmp_path / "none.json").load()
    assert (got.status, got.maxima, got.describe()) == (
        ManifestStatus.MISSING,
        {},
        "queue manifest: none",
    )


def test_writes_wait_for_the_interval_and_a_change(tmp_path: Path) -> None:
    path = tmp_path / "config" / "m.json"
    manifest = QueueManifest(path, interval_ms=1000)
    assert manifest.write_if_due([(("T", 0), 5), (("T", 1), 0)], now_ms=0)
    assert decode_manifest(path.read_bytes()) == {("T", 0): 5}
    assert not manifest.write_if_due([(("T", 0), 6)], now_ms=999)  # too soon
    assert manifest.write_if_due([(("T", 0), 6)], now_ms=1000)
    assert not manifest.write_if_due([(("T", 0), 6)], now_ms=5000)  # unchanged
    assert manifest.write_if_due([(("T", 0), 7)], now_ms=5001, final=True)  # a stop: at once
    assert manifest.writes == 3
    assert not path.with_name("m.json.tmp").exists()
    again = QueueManifest(path)
    assert again.load().maxima == {("T", 0): 7}
    assert not again.write_if_due([(("T", 0), 7)], now_ms=0)  # what it loaded: no write


def _send(store: MessageStore, per_queue: int, topic: str = "M", queues: int = 2) -> None:
    for _ in range(per_queue):
        for q in range(queues):
            assert store.put_message(Message(topic, b"x", queue_id=q)).ok
    assert store.wait_dispatched()


def _on_disk(path: Path) -> dict[tuple[str, int], int]:
    try:
        return decode_manifest(path.read_bytes())
    except (FileNotFoundError, ManifestDamage):
        return {}


def test_a_store_writes_the_manifest_as_it_runs_and_at_a_clean_stop(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """The ConsumeQueue flusher (every 50 ms here) writes it on its first round and
    then once per MANIFEST_INTERVAL_MS of the store's clock while queues grow."""
    config = make_config()
    path = manifest_path(config.store_path_root_dir)
    store = MessageStore.open(config, clock=clock)
    try:
        _send(store, 3)
        first = {("M", 0): 3, ("M", 1): 3}
        eventually_sync(lambda: _on_disk(path) == first, what="the first manifest")
        _send(store, 2)
        clock.advance(MANIFEST_INTERVAL_MS)
        grown = {("M", 0): 5, ("M", 1): 5}
        eventually_sync(lambda: _on_disk(path) == grown, what="the manifest after the interval")
        _send(store, 1, topic="N", queues=1)
    finally:
        assert store.shutdown()
    # The stop's last flush writes at once, whatever the interval.
    assert _on_disk(path) == {**grown, ("N", 0): 1}
    # A restart that changes nothing writes nothing, neither while running nor at the stop.
    store = MessageStore.open(config, clock=clock)
    try:
        assert store.recovery_report is not None
        assert store.recovery_report.queue_manifest == "queue manifest: 3 queues"
        clock.advance(MANIFEST_INTERVAL_MS)
    finally:
        assert store.shutdown()
    assert store.queue_manifest.writes == 0


def test_a_damaged_manifest_never_stops_a_start_and_is_written_again(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config()
    with MessageStore.open(config, clock=clock) as store:
        _send(store, 4)
    path = manifest_path(config.store_path_root_dir)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    with MessageStore.open(config, clock=clock) as store:
        report = store.recovery_report
        assert report is not None and report.queue_manifest.startswith("queue manifest: damaged")
        assert (report.queue_dirs_missing, report.kept_offsets) == (0, ())
        assert store.put_message(Message("M", b"y", queue_id=0)).queue_offsets == (4,)
    assert decode_manifest(path.read_bytes()) == {("M", 0): 5, ("M", 1): 4}

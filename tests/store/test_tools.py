"""``basalt store check`` and ``dump``: :mod:`basalt.store.consistency`, :mod:`basalt.store.dump`,
:mod:`basalt.store.tools`.

Every test writes through a real :class:`MessageStore` on ``tmp_path`` with
64 KiB CommitLog files and 16-unit ConsumeQueue files (so both roll), then
damages bytes on disk the way a bad disk or a bug would and checks that
``check_store`` names the problem — and that it never changes a byte itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from basalt.admin.cli import main
from basalt.common.record import HEADERS, fill_record_crc
from basalt.store import ManualClock, Message, MessageStore, MessageStoreConfig
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consistency import CheckReport, check_store
from basalt.store.consume_queue import BLANK_UNIT, UNIT
from basalt.store.dump import body_preview, dump_store
from basalt.store.hashing import tags_code
from basalt.store.mapped_file import file_name
from basalt.store.readonly import StoreRootError
from tests.support.stores import FILL_QUEUES, FILL_TOPICS, ConfigFactory, Sent, fill_store

CQ_FILE_SIZE = 16 * CQ_STORE_UNIT_SIZE
#: Field positions inside a record, from the layout's own struct formats.
QUEUEID_POS = struct.calcsize(">iIi")
QUEUEOFFSET_POS = struct.calcsize(">iIiii")
PHYSICALOFFSET_POS = struct.calcsize(">iIiiiq")
#: Where the body starts in a record with IPv4 born and store hosts.
BODY_START = HEADERS[False, False].size


@pytest.fixture
def config(make_config: ConfigFactory) -> MessageStoreConfig:
    return make_config(mapped_file_size_consume_queue=CQ_FILE_SIZE)


@pytest.fixture
def sent_and_root(config: MessageStoreConfig, clock: ManualClock) -> tuple[list[Sent], Path]:
    """A store filled by :func:`fill_store` and shut down cleanly."""
    with MessageStore.open(config, clock=clock) as store:
        sent = fill_store(store, clock)
    return sent, config.store_path_root_dir


@pytest.fixture
def root(sent_and_root: tuple[list[Sent], Path]) -> Path:
    return sent_and_root[1]


@pytest.fixture
def sent(sent_and_root: tuple[list[Sent], Path]) -> list[Sent]:
    return sent_and_root[0]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a digest of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def patch(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def xor_byte(path: Path, pos: int, mask: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        old = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([old ^ mask]))


def commitlog_file(root: Path, physical_offset: int, file_size: int) -> tuple[Path, int]:
    """The CommitLog file holding ``physical_offset`` and the position inside it."""
    start = physical_offset - physical_offset % file_size
    return root / "commitlog" / file_name(start), physical_offset - start


def cq_unit(root: Path, topic: str, queue_id: int, queue_offset: int) -> tuple[Path, int]:
    """The ConsumeQueue file holding unit ``queue_offset`` and the unit's position inside it."""
    pos = queue_offset * CQ_STORE_UNIT_SIZE
    start = pos - pos % CQ_FILE_SIZE
    return root / "consumequeue" / topic / str(queue_id) / file_name(start), pos - start


def codes(report: CheckReport) -> set[str]:
    return {p.code for p in report.problems}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


# -- a healthy store ---------------------------------------------------------------------


def test_check_passes_after_clean_shutdown_and_changes_nothing(
    root: Path, sent: list[Sent], config: MessageStoreConfig
) -> None:
    before = snapshot(root)

    report = check_store(root)

    assert report.ok, report.summary()
    assert report.problems == ()
    c = report.counts
    assert c.records == len(sent)
    assert c.records_not_dispatchable == 1
    assert c.commitlog_files >= 2 and c.end_of_file_blanks == c.commitlog_files - 1
    assert c.commitlog_file_size == config.mapped_file_size_commit_log
    assert c.commitlog_max_offset == sent[-1].physical_offset + sent[-1].size
    assert c.topics == len(FILL_TOPICS) and c.queues == len(FILL_TOPICS) * FILL_QUEUES
    assert c.consume_queue_units_checked == len(sent) - 1
    assert c.consume_queue_files > c.queues  # the ConsumeQueues rolled too
    assert c.undispatched_records == 0
    assert any("no abort file" in i for i in report.info)
    assert snapshot(root) == before  # no lock, no abort, no byte changed


def test_check_on_a_running_store_is_read_only_and_passes(
    store: MessageStore, clock: ManualClock
) -> None:
    sent = fill_store(store, clock, rounds=3)
    root = store.config.store_path_root_dir

    report = check_store(root)

    assert report.ok, report.summary()
    assert report.counts.records == len(sent)
    assert any("abort file present" in i for i in report.info)
    # The store holds its lock throughout and keeps working.
    assert store.put_message(Message(topic="TopicA", body=b"after")).ok


def test_cli_check_prints_a_summary_and_exits_0(
    root: Path, sent: list[Sent], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run_cli(capsys, "store", "check", str(root))

    assert status == 0, out + err
    assert f"{len(sent)} records" in out
    assert "TopicA/0:" in out and "%RETRY%group/2:" in out
    assert "problems: 0" in out
    assert out.rstrip().endswith("result: OK")


def test_cli_check_json_of_a_healthy_store(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "store", "check", str(root), "--json")

    doc = json.loads(out)
    assert status == 0
    assert doc["ok"] is True and doc["problems"] == []
    assert doc["counts"]["queues"] == len(FILL_TOPICS) * FILL_QUEUES
    assert {q["topic"] for q in doc["queues"]} == set(FILL_TOPICS)


def test_check_of_a_store_that_never_stored_anything(make_config: ConfigFactory) -> None:
    config = make_config()
    MessageStore.open(config).shutdown()

    report = check_store(config.store_path_root_dir)

    assert report.ok, report.summary()
    assert report.counts.records == report.counts.commitlog_files == report.counts.queues == 0


@pytest.fixture
def lagging_root(
    make_config: ConfigFactory, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A root whose last records are in the CommitLog but in no ConsumeQueue.

    The dispatcher is stopped before the last puts and cannot drain at shutdown,
    so the store leaves ``abort`` behind, as one that died there would.
    """
    config = make_config(mapped_file_size_consume_queue=CQ_FILE_SIZE)
    store = MessageStore.open(config, clock=clock)
    try:
        fill_store(store, clock, rounds=2)
        store.dispatcher.shutdown(drain=False)
        for queue_id in (0, 0, 2):
            assert store.put_message(Message(topic="TopicB", body=b"late", queue_id=queue_id)).ok
        monkeypatch.setattr(store.dispatcher, "dispatch_available", lambda: 0)
    finally:
        store.shutdown()
    assert config.abort_path.exists()
    return config.store_path_root_dir


def test_undispatched_records_with_abort_are_info(lagging_root: Path) -> None:
    report = check_store(lagging_root)

    assert report.ok, report.summary()
    assert report.counts.undispatched_records == 3
    assert any(
        i.startswith("undispatched records: 3 (TopicB/0: 2, TopicB/2: 1)") for i in report.info
    )
    assert {(q.topic, q.queue_id): q.undispatched for q in report.queues if q.undispatched} == {
        ("TopicB", 0): 2,
        ("TopicB", 2): 1,
    }


def test_undispatched_records_without_abort_are_a_problem(
    lagging_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A clean shutdown removes abort only after the dispatcher caught up: lag is damage.
    (lagging_root / "abort").unlink()

    report = check_store(lagging_root)

    assert not report.ok
    assert [(p.code, p.offset) for p in report.problems] == [
        ("undispatched", 2),  # TopicB/0: fill_store(rounds=2) put queue offsets 0 and 1
        ("undispatched", 2),
    ]
    assert "TopicB/0: 2 records from queue offset 2" in report.problems[0].message
    assert report.counts.undispatched_records == 3
    assert not any(i.startswith("undispatched records") for i in report.info)
    status, out, _ = run_cli(capsys, "store", "check", str(lagging_root))
    assert status == 1 and "[undispatched]" in out


# -- damage that check must name -----------------------------------------------------------


def test_flipped_body_byte_fails_the_crc(
    root: Path, sent: list[Sent], config: MessageStoreConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = next(s for s in sent[40:] if len(s.body) > 10)
    path, pos = commitlog_file(root, victim.physical_offset, config.mapped_file_size_commit_log)
    xor_byte(path, pos + BODY_START + 5, 0x01)

    status, out, _ = run_cli(capsys, "store", "check", str(root))

    assert status == 1
    assert f"commitlog offset {victim.physical_offset}" in out and "CRC" in out
    assert out.rstrip().endswith("result: INCONSISTENT")
    report = check_store(root)
    assert [p.code for p in report.problems] == ["commitlog-corrupt"]
    assert report.problems[0].offset == victim.physical_offset


@pytest.mark.parametrize("field", ["size", "tags_code"])
def test_corrupted_consume_queue_unit_is_a_mismatch(
    root: Path, sent: list[Sent], field: str
) -> None:
    victim = next(s for s in sent[30:] if s.tags and s.dispatchable)
    path, pos = cq_unit(root, victim.topic, victim.queue_id, victim.queue_offset)
    phy, size, code = UNIT.unpack(path.read_bytes()[pos : pos + CQ_STORE_UNIT_SIZE])
    assert (phy, size, code) == (victim.physical_offset, victim.size, tags_code(victim.tags))
    if field == "size":
        size += 1
    else:
        code = tags_code("SomeOtherTag")
    patch(path, pos, UNIT.pack(phy, size, code))

    report = check_store(root)

    assert not report.ok
    assert codes(report) == {"cq-mismatch"}
    (problem,) = report.problems
    assert problem.offset == victim.queue_offset
    assert ("size" if field == "size" else "tagsCode") in problem.message


def test_unit_pointing_at_another_queues_record(root: Path, sent: list[Sent]) -> None:
    victim = next(s for s in sent if (s.topic, s.queue_id) == ("TopicA", 0) and s.queue_offset > 3)
    other = next(s for s in sent if (s.topic, s.queue_id) == ("TopicB", 1))
    path, pos = cq_unit(root, victim.topic, victim.queue_id, victim.queue_offset)
    patch(path, pos, UNIT.pack(other.physical_offset, other.size, tags_code(other.tags)))

    report = check_store(root)

    assert codes(report) == {"cq-mismatch"}
    assert "belongs to TopicB/1" in report.problems[0].message


def test_filler_unit_over_a_stored_record_is_a_hole(root: Path, sent: list[Sent]) -> None:
    victim = [s for s in sent if (s.topic, s.queue_id) == ("TopicA", 2)][5]
    path, pos = cq_unit(root, victim.topic, victim.queue_id, victim.queue_offset)
    patch(path, pos, BLANK_UNIT)

    report = check_store(root)

    assert codes(report) == {"cq-hole"}
    assert report.problems[0].offset == victim.queue_offset


def test_zeroed_unit_followed_by_units_is_a_hole(root: Path, sent: list[Sent]) -> None:
    victim = [s for s in sent if (s.topic, s.queue_id) == ("TopicB", 0)][3]
    path, pos = cq_unit(root, victim.topic, victim.queue_id, victim.queue_offset)
    patch(path, pos, bytes(CQ_STORE_UNIT_SIZE))

    report = check_store(root)

    assert "cq-hole" in codes(report)


def test_rewritten_queue_offset_breaks_the_sequence(
    root: Path, sent: list[Sent], config: MessageStoreConfig
) -> None:
    # A record written with a wrong QUEUEOFFSET (a writer's bug, not a flipped bit:
    # its CRC32 property is rewritten to match): only the sequence and the
    # ConsumeQueue can tell.
    victim = [s for s in sent if (s.topic, s.queue_id) == ("TopicA", 1)][4]
    path, pos = commitlog_file(root, victim.physical_offset, config.mapped_file_size_commit_log)
    patch(path, pos + QUEUEOFFSET_POS, struct.pack(">q", victim.queue_offset + 100))
    record = bytearray(path.read_bytes()[pos : pos + victim.size])
    fill_record_crc(record)
    patch(path, pos, bytes(record))

    report = check_store(root)

    assert {"queue-offset", "cq-mismatch"} <= codes(report)


def test_wrong_physical_offset_field(
    root: Path, sent: list[Sent], config: MessageStoreConfig
) -> None:
    victim = sent[17]
    path, pos = commitlog_file(root, victim.physical_offset, config.mapped_file_size_commit_log)
    patch(path, pos + PHYSICALOFFSET_POS, struct.pack(">q", victim.physical_offset + 8))

    report = check_store(root)

    assert "commitlog-corrupt" in codes(report)
    assert any("PHYSICALOFFSET" in p.message for p in report.problems)


def test_missing_middle_file_and_odd_sized_file(root: Path, config: MessageStoreConfig) -> None:
    files = sorted((root / "commitlog").iterdir())
    assert len(files) >= 3
    files[1].unlink()
    with open(files[-1], "ab") as f:
        f.write(b"\0" * 10)

    report = check_store(root)

    assert {"file-gap", "file-size"} <= codes(report)


def test_problems_are_json_with_ok_false(
    root: Path, sent: list[Sent], capsys: pytest.CaptureFixture[str]
) -> None:
    victim = sent[-3]
    path, pos = cq_unit(root, victim.topic, victim.queue_id, victim.queue_offset)
    patch(path, pos + 8, struct.pack(">i", victim.size + 4))

    status, out, _ = run_cli(capsys, "store", "check", "--json", str(root))

    doc = json.loads(out)
    assert status == 1
    assert doc["ok"] is False and doc["problems_total"] == 1
    assert doc["problems"][0]["code"] == "cq-mismatch"
    assert doc["problems"][0]["offset"] == victim.queue_offset


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_any_flipped_byte_of_a_covered_field_is_detected(
    sent_and_root: tuple[list[Sent], Path], config: MessageStoreConfig, data: st.DataObject
) -> None:
    """Bytes under the CRC, the size/magic/offset fields and the topic/queue id are all checked.

    The root is shared by every example: the byte is flipped back afterwards.
    """
    sent, root = sent_and_root
    victim = data.draw(st.sampled_from([s for s in sent if s.dispatchable]))
    topic_len_pos = BODY_START + len(victim.body)
    covered = [
        *range(0, QUEUEID_POS + 4),  # TOTALSIZE, MAGICCODE, BODYCRC, QUEUEID
        *range(QUEUEOFFSET_POS, PHYSICALOFFSET_POS + 8),  # QUEUEOFFSET, PHYSICALOFFSET
        *range(BODY_START - 4, topic_len_pos + 1 + len(victim.topic)),  # BODYLEN…TOPIC
    ]
    offset = data.draw(st.sampled_from(covered))
    mask = data.draw(st.integers(1, 255))
    path, pos = commitlog_file(root, victim.physical_offset, config.mapped_file_size_commit_log)
    xor_byte(path, pos + offset, mask)
    try:
        assert not check_store(root).ok
    finally:
        xor_byte(path, pos + offset, mask)
    assert check_store(root).ok


# -- usage errors ---------------------------------------------------------------------------


def test_missing_root_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(StoreRootError):
        check_store(missing)
    for command in ("check", "dump"):
        status, out, err = run_cli(capsys, "store", command, str(missing))
        assert status == 2
        assert "no such store root" in err and str(missing) in err
        assert "Traceback" not in out + err


def test_a_directory_that_is_not_a_store_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "somewhere").mkdir()
    status, _, err = run_cli(capsys, "store", "check", str(tmp_path / "somewhere"))
    assert status == 2 and "not a store root" in err


# -- dump -----------------------------------------------------------------------------------


def dump_lines(
    root: Path,
    *,
    topic: str | None = None,
    queue_id: int | None = None,
    from_offset: int | None = None,
) -> tuple[list[str], list[str]]:
    """(record lines, other lines) of a dump."""
    out = io.StringIO()
    result = dump_store(root, out, topic=topic, queue_id=queue_id, from_offset=from_offset)
    assert result.ok, out.getvalue()
    lines = out.getvalue().splitlines()
    records = [line for line in lines if line.startswith("offset: ")]
    assert result.records == len(records)
    return records, [line for line in lines if not line.startswith("offset: ")]


def field_of(line: str, name: str) -> str:
    return line.split(f" {name}: ", 1)[1].split(" ", 1)[0] if f" {name}: " in line else ""


def test_dump_prints_every_record_in_order(root: Path, sent: list[Sent]) -> None:
    records, other = dump_lines(root)

    assert [int(line.split()[1]) for line in records] == [s.physical_offset for s in sent]
    assert other[-1] == f"records: {len(sent)}"
    first = records[0]
    s = sent[0]
    assert f"size: {s.size} queueId: {s.queue_id} queueOffset: {s.queue_offset} " in first
    assert "storeTimestamp: 1700000000007 (2023-11-14T22:13:20.007Z)" in first
    assert f'topic: "{s.topic}"' in first and f'tags: "{s.tags}"' in first
    assert 'keys: ["key-1", "shared"]' in first
    assert '"round": "0"' in first
    assert "transaction: PREPARED" in records[-2]


def test_dump_filters_by_topic_and_queue(root: Path, sent: list[Sent]) -> None:
    by_topic, _ = dump_lines(root, topic="TopicB")
    by_queue, _ = dump_lines(root, queue_id=2)

    assert len(by_topic) == sum(1 for s in sent if s.topic == "TopicB")
    assert all('topic: "TopicB"' in line for line in by_topic)
    assert len(by_queue) == sum(1 for s in sent if s.queue_id == 2)
    assert all(field_of(line, "queueId") == "2" for line in by_queue)


def test_dump_from_a_physical_offset(root: Path, sent: list[Sent]) -> None:
    start = sent[100].physical_offset
    records, _ = dump_lines(root, from_offset=start + 1)  # inside a record: starts at the next

    assert [int(line.split()[1]) for line in records] == [s.physical_offset for s in sent[101:]]


def test_dump_through_a_consume_queue_from_a_queue_offset(
    root: Path, sent: list[Sent], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run_cli(
        capsys,
        "store",
        "dump",
        str(root),
        "--topic",
        "%RETRY%group",
        "--queue",
        "1",
        "--from-offset",
        "5",
    )

    assert status == 0
    lines = [line for line in out.splitlines() if line.startswith("offset: ")]
    expected = [s for s in sent if (s.topic, s.queue_id) == ("%RETRY%group", 1)][5:]
    assert [int(field_of(line, "queueOffset")) for line in lines] == [
        s.queue_offset for s in expected
    ]
    assert [int(line.split()[1]) for line in lines] == [s.physical_offset for s in expected]
    assert "consumequeue/%RETRY%group/1 from queue offset 5" in out


def test_dump_stops_at_a_corrupt_record(
    root: Path, sent: list[Sent], config: MessageStoreConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = next(s for s in sent[50:] if s.body)
    path, pos = commitlog_file(root, victim.physical_offset, config.mapped_file_size_commit_log)
    xor_byte(path, pos + BODY_START, 0x80)

    status, out, err = run_cli(capsys, "store", "dump", str(root))

    assert status == 1
    lines = out.splitlines()
    assert lines[-2] == f"corrupt record at offset {victim.physical_offset}: body CRC mismatch"
    assert sum(1 for line in lines if line.startswith("offset: ")) == sent.index(victim)
    assert "CRC" in err


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", '""'),
        (b"hello\nworld", '"hello\\nworld"'),
        ("ünï".encode(), '"ünï"'),
        (b"\x00\xff", "0x00ff"),
        (b"a" * 70, '"' + "a" * 64 + '"...'),
        ("aé".encode() * 40, '"' + "aé" * 21 + 'a"...'),  # a cut inside a character
    ],
)
def test_body_preview(body: bytes, expected: str) -> None:
    assert body_preview(body) == expected


def test_a_one_file_commitlog_longer_than_configured_fails_with_the_stores_size(
    make_config: ConfigFactory, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """The store refuses a CommitLog file of any size but its setting; with that
    setting given, check refuses it too, even when it is the store's only file
    (nothing on disk to compare it with)."""
    config = make_config(mapped_file_size_consume_queue=CQ_FILE_SIZE)
    with MessageStore.open(config, clock=clock) as store:
        assert store.put_message(Message(topic="TopicA", body=b"one")).ok
    root = config.store_path_root_dir
    (only,) = sorted((root / "commitlog").iterdir())
    with open(only, "ab") as f:
        f.write(b"\0" * 4096)  # one page past the configured size
    size = str(config.mapped_file_size_commit_log)

    status, out, err = run_cli(
        capsys, "store", "check", str(root), "--json", "--mapped-file-size-commit-log", size
    )
    doc = json.loads(out)
    assert status == 1, out + err
    assert any(p["code"] == "file-size" and only.name in p["message"] for p in doc["problems"])

    # Without the setting, the only file is its own measure (the option's help says so).
    status, out, err = run_cli(capsys, "store", "check", str(root))
    assert status == 0, out + err

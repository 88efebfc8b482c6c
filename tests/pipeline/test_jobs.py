"""``basalt pipeline`` jobs against real store roots written with MessageStore on tmp_path."""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path
from typing import Any

import pytest

from basalt.admin import cli
from basalt.common.record import decode_record
from basalt.pipeline import jobs
from basalt.pipeline._index import SCRATCH_DIR
from basalt.store import Message, MessageStore
from basalt.store.clock import ManualClock
from basalt.store.index_file import index_file_name
from basalt.store.index_service import IndexService
from basalt.store.readonly import StoreRootError, check_at, open_data_files, store_layout
from tests.support.processes import local_cluster, run_basalt_sync
from tests.support.spark import spark  # noqa: F401
from tests.support.stores import small_store_config

TOPICS = ("orders", "audit")


def _write_root(root: Path, count: int = 600) -> list[Message]:
    """A store root of ``count`` messages over two topics and three queues
    (small files: several CommitLog and ConsumeQueue files), shut down cleanly."""
    messages = [
        Message(
            topic=TOPICS[i % 2],
            body=(b"%05d" % i) * 40,
            queue_id=i % 3,
            tags=("red", "blue", None)[i % 3],
            keys=[f"k{i}"],
            properties={"n": str(i)},
        )
        for i in range(count)
    ]
    store = MessageStore.open(small_store_config(root))
    try:
        for at in range(0, count, 50):
            store.put_messages(messages[at : at + 50])
    finally:
        store.shutdown()
    return messages


@pytest.fixture(scope="module")
def session(spark: Any) -> Any:  # noqa: F811 (tests.support.spark's module fixture)
    """The module's SparkSession, under a name that does not shadow the import."""
    return spark


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("roots") / "broker-a"
    _write_root(path)
    return path


def _store_records(root: Path) -> list[Any]:
    """Every record of the root, decoded by the engine's codec."""

    class Sink:
        def problem(self, *a: Any, **k: Any) -> None:
            raise AssertionError(a)

        def note(self, message: str) -> None:
            pass

    files = open_data_files(store_layout(root).commitlog_dir, "commitlog", Sink())
    out = []
    try:
        for mf in files.files:
            pos = 0
            while (info := check_at(mf, pos)).kind.value == "message":
                out.append(decode_record(mf.read(pos, info.size)))
                pos += info.size
    finally:
        files.close()
    return out


def test_export_to_parquet_equals_the_stores_records(
    session: Any, root: Path, tmp_path: Path
) -> None:
    result = jobs.export(session, root, str(tmp_path / "out"))
    assert result.ok and result.files > 1
    rows = {r.commitlog_offset: r for r in session.read.parquet(str(tmp_path / "out")).collect()}
    records = _store_records(root)
    assert result.rows == len(rows) == len(records) == 600
    for rec in records:
        row = rows[rec.commit_log_offset]
        assert (row.topic, row.broker, row.queue_id, row.queue_offset) == (
            rec.topic, "broker-a", rec.queue_id, rec.queue_offset,
        )  # fmt: skip
        assert (row.msg_id, row.tags, row.body) == (rec.msg_id, rec.tags, rec.body)
        assert row.keys == rec.properties["KEYS"] and dict(row.properties) == rec.properties
        assert row.store_timestamp == rec.store_timestamp_ms
        assert row.born_timestamp == rec.born_timestamp_ms


def test_export_filters_topic_and_time(session: Any, root: Path, tmp_path: Path) -> None:
    records = _store_records(root)
    cut = sorted(r.store_timestamp_ms for r in records)[300]
    result = jobs.export(session, root, str(tmp_path / "o"), topic="audit", from_ms=cut)
    want = [r for r in records if r.topic == "audit" and r.store_timestamp_ms >= cut]
    assert result.rows == len(want) > 0


def test_verify_a_sound_root_then_a_flipped_byte(session: Any, root: Path, tmp_path: Path) -> None:
    good = jobs.verify(session, root)
    assert good.ok, good.summary()
    assert good.records == 600 and good.report.count() == good.files
    assert good.report.agg({"cq_units_checked": "sum"}).first()[0] == 600
    damaged = tmp_path / "damaged"
    shutil.copytree(root, damaged)
    victim = _store_records(root)[100]
    commitlog = sorted((damaged / "commitlog").iterdir())
    size = commitlog[0].stat().st_size
    path = commitlog[victim.commit_log_offset // size]
    data = bytearray(path.read_bytes())
    data[victim.commit_log_offset % size + victim.store_size - 30] ^= 0xFF  # in the body
    path.write_bytes(bytes(data))
    bad = jobs.verify(session, damaged)
    assert not bad.ok and bad.bad_records == 1 and bad.records == 599
    row = bad.report.where("bad_records > 0").first()
    assert (
        row.first_bad_offset == victim.commit_log_offset and "CRC" in row.first_bad_reason.upper()
    )
    exported = jobs.export(session, damaged, str(tmp_path / "x"))
    assert exported.bad_records == 1 and exported.rows == 599
    assert exported.bad[0][0] == victim.commit_log_offset


def test_verify_finds_a_consume_queue_unit_that_points_elsewhere(
    session: Any, root: Path, tmp_path: Path
) -> None:
    damaged = tmp_path / "cq"
    shutil.copytree(root, damaged)
    victim = next(r for r in _store_records(root) if (r.topic, r.queue_id) == ("orders", 0))
    first = sorted((damaged / "consumequeue" / "orders" / "0").iterdir())[0]
    data = bytearray(first.read_bytes())
    at = victim.queue_offset * 20
    data[at : at + 8] = (victim.commit_log_offset + 1).to_bytes(8, "big")
    first.write_bytes(bytes(data))
    result = jobs.verify(session, damaged)
    assert not result.ok and result.bad_records == 0 and result.cq_mismatches == 1
    assert result.report.where("cq_mismatches > 0").first().first_cq_mismatch == (
        victim.commit_log_offset
    )


def test_rebuild_index_is_byte_identical_to_the_dispatchers(
    session: Any, root: Path, tmp_path: Path
) -> None:
    out = tmp_path / "rebuilt"
    result = jobs.rebuild_index(session, root, out)
    assert result.units == 600 and result.queues == 6
    original = root / "consumequeue"
    want = sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    got = sorted(
        p.relative_to(out / "consumequeue")
        for p in (out / "consumequeue").rglob("*")
        if p.is_file()
    )
    assert got == want and len(want) > 6  # several files per queue
    for rel in want:
        assert (out / "consumequeue" / rel).read_bytes() == (original / rel).read_bytes(), rel
    with pytest.raises(ValueError, match="not empty"):
        jobs.rebuild_index(session, root, out)


#: IndexFiles small enough that the keyed root rolls several: 63 entries a file.
KEYED_INDEX = {"max_hash_slot_num": 16, "max_index_num": 64}


@pytest.fixture(scope="module")
def keyed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root whose 240 messages carry a UNIQ_KEY and one or two KEYS each (600
    index entries), some keys shared: about ten IndexFiles, several records'
    keys split over two files."""
    path = tmp_path_factory.mktemp("keyed") / "broker-k"
    messages = [
        Message(
            topic=TOPICS[i % 2],
            body=b"%05d" % i,
            queue_id=i % 2,
            keys=[f"k{i}", f"group{i % 7}"] if i % 2 else [f"k{i}"],
            properties={"UNIQ_KEY": f"U{i:08X}"},
        )
        for i in range(240)
    ]
    store = MessageStore.open(small_store_config(path, **KEYED_INDEX))
    try:
        for at in range(0, len(messages), 16):
            store.put_messages(messages[at : at + 16])
    finally:
        store.shutdown()
    return path


def _index_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / "index").iterdir())}


def _query(root: Path, topic: str, key: str) -> list[int]:
    service = IndexService(root, clock=ManualClock(), **KEYED_INDEX)
    service.load(True, 0)
    try:
        return service.query_offset(topic, key, 64, 0, 2**62).phy_offsets
    finally:
        service.shutdown()


def test_rebuild_index_writes_the_stores_index_files_byte_for_byte(
    session: Any, keyed_root: Path, tmp_path: Path
) -> None:
    original = _index_files(keyed_root)
    assert len(original) >= 3
    out = tmp_path / "rebuilt"
    result = jobs.rebuild_index(session, keyed_root, out, **KEYED_INDEX)
    assert result.ok and result.index_files == len(original)
    assert result.index_entries == 600 and result.units == 240
    assert _index_files(out) == original  # names and bytes
    assert not (out / SCRATCH_DIR).exists()
    for topic, key in (("orders", "k10"), ("audit", "group3"), ("orders", "U0000000A")):
        want = _query(keyed_root, topic, key)
        assert want and _query(out, topic, key) == want, (topic, key)
    # The geometry is found from the files' size; a wrong one is refused before any task.
    assert jobs.rebuild_index(session, keyed_root, tmp_path / "found").index_files == len(original)
    assert _index_files(tmp_path / "found") == original
    with pytest.raises(ValueError, match="fit no geometry"):
        jobs.rebuild_index(session, keyed_root, tmp_path / "other", max_hash_slot_num=17)


def test_rebuild_index_of_a_root_whose_index_is_damaged_or_gone(
    session: Any, keyed_root: Path, tmp_path: Path
) -> None:
    original = _index_files(keyed_root)
    damaged = tmp_path / "damaged"
    shutil.copytree(keyed_root, damaged)
    second = sorted((damaged / "index").iterdir())[1]
    second.write_bytes(second.read_bytes()[:1000])  # truncated: damaged, name kept
    jobs.rebuild_index(session, damaged, tmp_path / "a", **KEYED_INDEX)
    assert _index_files(tmp_path / "a") == original
    shutil.rmtree(damaged / "index")
    # Through the command: no IndexFiles to size the geometry from, so the flags give it.
    parser = argparse.ArgumentParser()
    jobs.add_commands(parser)
    flags = ["--max-hash-slot-num", "16", "--max-index-num", "64"]
    parsed = parser.parse_args(
        ["rebuild-index", "--root", str(damaged), "--out", str(tmp_path / "b"), *flags]
    )
    out, err = io.StringIO(), io.StringIO()
    assert parsed.handler(parsed, out, err) == 0, err.getvalue()
    assert f"{len(original)} IndexFiles: 600 entries" in out.getvalue()
    rebuilt = _index_files(tmp_path / "b")
    assert list(rebuilt.values()) == list(original.values())
    # No names to keep: each file is named by its first entry's store time, or one
    # millisecond after the previous name when files begin within the same one.
    names = list(rebuilt)
    firsts = [index_file_name(int.from_bytes(data[:8], "big")) for data in rebuilt.values()]
    assert names[0] == firsts[0] and names == sorted(set(names))
    assert all(name >= first for name, first in zip(names, firsts, strict=True))


def test_verify_finds_consume_queue_units_past_the_commitlog_or_at_no_record(
    session: Any, root: Path, tmp_path: Path
) -> None:
    good = jobs.verify(session, root)
    assert good.bad_units == 0 and good.units_report.count() == 6
    assert good.units_report.agg({"units_checked": "sum"}).first()[0] == 600
    damaged = tmp_path / "units"
    shutil.copytree(root, damaged)
    queue = damaged / "consumequeue" / "audit" / "1"
    files = sorted(queue.iterdir())
    units = sum((r.topic, r.queue_id) == ("audit", 1) for r in _store_records(root))
    file_units = files[0].stat().st_size // 20
    at_file = queue / f"{units // file_units * file_units * 20:020d}"
    data = bytearray(at_file.read_bytes() if at_file.exists() else bytes(file_units * 20))
    end = sum(f.stat().st_size for f in (damaged / "commitlog").iterdir())
    # One more unit after the queue's last: a record far past the CommitLog's end.
    at = units % file_units * 20
    data[at : at + 20] = (end + 4096).to_bytes(8, "big") + (99).to_bytes(4, "big") + bytes(8)
    at_file.write_bytes(bytes(data))
    result = jobs.verify(session, damaged)
    assert not result.ok and result.bad_units == 1 and result.cq_mismatches == 0
    row = result.units_report.where("bad_units > 0").first()
    assert (row.topic, row.queue_id, row.first_bad_unit) == ("audit", 1, units)
    assert "no CommitLog file holds" in row.first_bad_reason
    out, err = io.StringIO(), io.StringIO()
    parser = argparse.ArgumentParser()
    jobs.add_commands(parser)
    parsed = parser.parse_args(["verify", "--root", str(damaged)])
    assert parsed.handler(parsed, out, err) == 1 and "bad_units=1" in out.getvalue()


def test_bad_arguments_fail_with_a_clear_message(root: Path, tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    for args, reason in (
        (["export", "--root", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "no such"),
        (["verify", "--root", str(tmp_path / "plain")], "not a store root"),
        (["export", "--root", str(root), "--out", str(tmp_path / "plain")], "exists"),
        (["rebuild-index", "--root", str(tmp_path / "plain"), "--out", "x"], "not a store root"),
    ):
        parser = argparse.ArgumentParser()
        jobs.add_commands(parser)
        parsed = parser.parse_args(args)
        out, err = io.StringIO(), io.StringIO()
        assert parsed.handler(parsed, out, err) == 2
        assert reason in err.getvalue() and "Traceback" not in err.getvalue()
    # Through the ``basalt`` console script's parser: the pipeline group is wired.
    assert cli.main(["pipeline", "verify", "--root", str(tmp_path / "plain")]) == 2
    with pytest.raises(StoreRootError):
        jobs.verify(None, tmp_path / "plain")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a time"):
        jobs.parse_time("yesterday")
    assert jobs.parse_time("1970-01-01T00:00:01Z") == 1000 == jobs.parse_time("1000")


@pytest.mark.slow
def test_lag_report_of_a_group_that_consumed_part(tmp_path: Path) -> None:
    no_env = {"BASALT_ETCD": "", "BASALT_ENDPOINTS": ""}
    with local_cluster(tmp_path / ".basalt") as rows:
        etcd = next(r["address"] for r in rows if r["role"] == "etcd")
        pull = next(r["address"] for r in rows if r["role"] == "pull-service")
        for argv in (
            ("produce", "-t", "Lagging", "-n", "10", "--size", "50", "--endpoints", pull),
            ("consume", "-t", "Lagging", "-g", "Part", "--count", "4", "--endpoints", pull),
        ):
            done = run_basalt_sync(*argv, env=no_env)
            assert done.returncode == 0, done.stderr
        parser = argparse.ArgumentParser()
        jobs.add_commands(parser)
        args = ["lag-report", "-g", "Part", "--endpoint", etcd, "--out", str(tmp_path / "r")]
        for _ in range(2):  # two snapshots: the CSV grows, one header
            parsed = parser.parse_args(args)
            out, err = io.StringIO(), io.StringIO()
            assert parsed.handler(parsed, out, err) == 0, err.getvalue()
        lines = (tmp_path / "r" / "lag.csv").read_text().splitlines()
        assert lines[0].startswith("at_ms,group,topic") and "at_ms" not in "".join(lines[1:])
        snapshot = [line.split(",") for line in lines[1 : 1 + (len(lines) - 1) // 2]]
        assert {r[1] for r in snapshot} == {"Part"} and {r[2] for r in snapshot} == {"Lagging"}
        assert sum(int(r[5]) for r in snapshot) == 10
        assert sum(int(r[7]) for r in snapshot) == 6  # 4 of 10 consumed
        assert "Lagging" in out.getvalue()
        # The chart: the CSV's history, one line per group and topic, as a PNG.
        png = (tmp_path / "r" / "lag.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
        (series,) = jobs.lag_series(tmp_path / "r" / "lag.csv").items()
        assert series[0] == ("Part", "Lagging")
        assert [lag for _, lag in series[1]] == [6, 6]
        parsed = parser.parse_args(["lag-report", "-g", "Nobody", "--endpoint", etcd])
        out, err = io.StringIO(), io.StringIO()
        assert parsed.handler(parsed, out, err) == 1 and "Nobody" in err.getvalue()


def test_export_reads_back_in_the_source_schema_with_a_success_marker(
    session: Any, root: Path, tmp_path: Path
) -> None:
    from pyspark.sql.types import StructType

    from basalt.pipeline._rows import SCHEMA_DDL

    out = tmp_path / "typed"
    result = jobs.export(session, root, str(out), topic="orders")
    assert (out / "_SUCCESS").exists() and not list(out.glob("_staging-*"))
    df = session.read.parquet(str(out))
    assert df.schema == StructType.fromDDL(SCHEMA_DDL)
    assert dict(df.dtypes)["properties"] == "map<string,string>"
    row = df.orderBy("commitlog_offset").first()
    rec = next(r for r in _store_records(root) if r.commit_log_offset == row.commitlog_offset)
    assert row.store_timestamp == rec.store_timestamp_ms > 1_600_000_000_000  # ms, as a long
    assert dict(row.properties)["n"] == rec.properties["n"] and result.rows == 300
    # overwrite replaces the output whole; an empty export still reads back typed
    again = jobs.export(session, root, str(out), to_ms=0, mode="overwrite")
    assert again.rows == 0 and session.read.parquet(str(out)).schema == df.schema
    with pytest.raises(FileExistsError):
        jobs.export(session, root, str(out))


def test_a_failing_export_task_leaves_no_committed_output(
    session: Any, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = jobs.commitlog_files(root)
    gone = jobs.FileSpec(str(root), str(tmp_path / "gone"), files[-1].start + 1, files[-1].size)
    # the driver lists a file no task can open: the other tasks write their parts
    monkeypatch.setattr(jobs, "commitlog_files", lambda _root: [*files, gone])
    out = tmp_path / "failed"
    with pytest.raises(Exception, match="gone"):
        jobs.export(session, root, str(out))
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "old.parquet").write_bytes(b"old")
    with pytest.raises(Exception, match="gone"):
        jobs.export(session, root, str(kept), mode="overwrite")
    assert [p.name for p in kept.iterdir()] == ["old.parquet"]

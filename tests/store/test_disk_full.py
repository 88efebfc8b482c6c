"""A full disk (here: a file-size limit) refuses sends with a clear status and
loses nothing that was acknowledged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.store import Message, MessageStore, MessageStoreConfig
from tests.support.stores import SMALL_COMMITLOG_FILE, SMALL_CQ_FILE, SMALL_INDEX
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

_CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    from basalt.store import Message, MessageStore, MessageStoreConfig

    config = MessageStoreConfig(
        store_path_root_dir=Path(sys.argv[1]),
        mapped_file_size_commit_log=int(sys.argv[3]),
        mapped_file_size_consume_queue=int(sys.argv[4]),
        max_hash_slot_num=512,
        max_index_num=2048,
    )
    store = MessageStore.open(config)
    assert store.put_message(Message("Warm", b"creates the first file")).ok
    # From here no write may reach past the limit: the first commitlog file fills
    # up half way, and the write that crosses the limit comes back short.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    for i in range(200):
        batch = [Message("Full", f"{i}-{j}".encode() * 40) for j in range(4)]
        r = store.put_messages(batch)
        print(json.dumps({"status": r.status.value, "detail": r.detail,
                          "offsets": list(r.queue_offsets), "i": i}), flush=True)
    store.shutdown()
    """
)


def test_sends_past_the_disk_limit_fail_clearly_and_acknowledged_ones_survive(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    limit = SMALL_COMMITLOG_FILE // 2 + 100  # not on a record boundary: a short write
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(root),
            str(limit),
            str(SMALL_COMMITLOG_FILE),
            str(SMALL_CQ_FILE),
        ],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    results = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(results) == 200, child.stderr
    statuses = {r["status"] for r in results}
    assert statuses == {"PUT_OK", "CREATE_MAPPED_FILE_FAILED"}
    refused = [r for r in results if r["status"] != "PUT_OK"]
    assert all("cannot write" in r["detail"] for r in refused)
    acked = {
        (r["i"], j): off
        for r in results
        if r["status"] == "PUT_OK"
        for j, off in enumerate(r["offsets"])
    }

    config = MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=SMALL_COMMITLOG_FILE,
        mapped_file_size_consume_queue=SMALL_CQ_FILE,
        **SMALL_INDEX,
    )
    with MessageStore(config) as store:
        for (i, j), offset in acked.items():
            record = store.get_message_by_queue_offset("Full", 0, offset)
            assert record is not None
            assert record.body == f"{i}-{j}".encode() * 40
        # With room again, sends continue right after the acknowledged ones.
        again = store.put_message(Message("Full", b"after"))
        assert again.ok
        assert again.queue_offsets == (len(acked),)


# -- a real full disk: a 16 MiB tmpfs ----------------------------------------------------

#: Opens the store on a 16 MiB tmpfs and sends 4 KiB messages until refused, then fills
#: what is left with a plain file, commits an offset and stops; prints JSON lines.
_FILL = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from basalt.store import FlushDiskType, Message, MessageStore, MessageStoreConfig
    from basalt.store.expiry import disk_used_percent

    root = Path(sys.argv[1])
    settings = json.loads(sys.argv[2])
    settings["flush_disk_type"] = FlushDiskType(settings["flush_disk_type"])
    config = MessageStoreConfig(**settings, store_path_root_dir=root)
    store = MessageStore.open(config)
    acked, first_refusal = 0, None
    for i in range(20_000):
        r = store.put_message(Message("Full", b"%08d" % i + bytes(4088)))
        if r.ok:
            acked += 1
            continue
        first_refusal = {"status": r.status.value, "detail": r.detail,
                         "used": disk_used_percent(root)}
        break
    assert store.commit_offset("G", "Full", 0, acked).ok
    # The rest of the disk goes to someone else.
    with open(root.parent / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(64 * 1024))
                f.flush()
        except OSError as e:
            filled = str(e)
    assert store.commit_offset("G", "Full", 0, acked - 1).ok  # answered OK: must survive
    late = store.put_message(Message("Full", b"late"))
    print(json.dumps({"acked": acked, "refusal": first_refusal, "filled": filled,
                      "late": late.status.value, "used": disk_used_percent(root),
                      "clean": store.shutdown()}), flush=True)
    """
)

#: Restarts the store on the full disk, reads every message, prints JSON.
_RESTART = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from basalt.store import FlushDiskType, MessageStore, MessageStoreConfig

    root = Path(sys.argv[1])
    settings = json.loads(sys.argv[2])
    settings["flush_disk_type"] = FlushDiskType(settings["flush_disk_type"])
    config = MessageStoreConfig(**settings, store_path_root_dir=root)
    with MessageStore(config) as store:
        bodies = [r.body[:8] for _, r in store.iter_queue("Full", 0)]
        print(json.dumps({"count": len(bodies), "ordered": bodies == [b"%08d" % i for i in
                          range(len(bodies))], "offset": store.query_offset("G", "Full", 0),
                          "healthy": store.healthy}), flush=True)
    """
)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted under ``tmp_path`` (the tests run as root), unmounted after."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"cannot mount a 16 MiB tmpfs at {mount_point} (the full-disk test needs root "
            f"and mount): {mounted.stderr.strip()}"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    child = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    # A signal (SIGBUS on a hole of a full tmpfs) is a negative return code.
    assert child.returncode >= 0, f"killed by signal {-child.returncode}: {child.stderr[-2000:]}"
    return child


def test_a_full_tmpfs_refuses_sends_before_it_is_full_and_restarts_and_checks_without_a_signal(
    small_tmpfs: Path,
) -> None:
    root = small_tmpfs / "store"
    settings = json.dumps(
        {
            "flush_disk_type": "SYNC_FLUSH",
            "mapped_file_size_commit_log": 1024 * 1024,
            "mapped_file_size_consume_queue": 20 * 1024,
            **SMALL_INDEX,
            # Nothing acknowledged may be deleted to make room: no forced cleaning.
            "clean_file_forcibly_enable": False,
        }
    )
    fill = _run_child(_FILL, str(root), settings)
    assert fill.returncode == 0, fill.stderr[-3000:]
    result = json.loads(fill.stdout.splitlines()[-1])
    refusal = result["refusal"]
    assert refusal is not None, "no send was refused on a 16 MiB disk"
    assert refusal["status"] == "SERVICE_NOT_AVAILABLE"
    assert "disk_space_warning_level_ratio" in refusal["detail"]
    assert refusal["used"] < 95, refusal  # refused near 90 %, not at 100 %
    assert "No space left" in result["filled"]
    assert result["used"] > 99.9  # the disk is full now
    assert result["late"] == "SERVICE_NOT_AVAILABLE"
    # The offsets' last save took its reserve: the commit answered OK survived the stop.
    assert result["clean"] is True, fill.stderr[-3000:]

    # A restart on the full disk comes up and reads everything (no signal).
    restart = _run_child(_RESTART, str(root), settings)
    assert restart.returncode == 0, restart.stderr[-3000:]
    after = json.loads(restart.stdout.splitlines()[-1])
    assert after["count"] == result["acked"] and after["ordered"]
    assert after["offset"] == result["acked"] - 1

    # store check reads only data extents of the sparse files: a report, no signal.
    check = _run_child(
        "import sys; from basalt.admin.cli import main; sys.exit(main(sys.argv[1:]))",
        "store",
        "check",
        str(root),
        "--json",
    )
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    report = json.loads(check.stdout)
    assert report["ok"] is True, report


def test_store_check_and_dump_on_a_full_tmpfs_report_and_never_die_of_sigbus(
    small_tmpfs: Path,
) -> None:
    """Issue 28 point 6: on a full tmpfs, ``store check`` read the sparse files through
    a mapping and died of SIGBUS (exit -7): a read fault on a hole allocates a page,
    and there is none. The read-only tools now read with pread (a hole reads as zeros)."""
    root = small_tmpfs / "store"
    config = MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=SMALL_COMMITLOG_FILE * 4,
        mapped_file_size_consume_queue=SMALL_CQ_FILE * 16,
        **SMALL_INDEX,  # type: ignore[arg-type]
    )
    with MessageStore(config) as store:
        for i in range(20):
            assert store.put_message(Message("T", b"x%d" % i)).ok
    # Fill the disk: every page left goes to a filler file.
    with (small_tmpfs / "filler").open("wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
                f.flush()
        except OSError:
            pass
    cli = "import sys; from basalt.admin.cli import main; sys.exit(main(sys.argv[1:]))"
    check = _run_child(cli, "store", "check", str(root), "--json")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert json.loads(check.stdout)["counts"]["records"] == 20
    dump = _run_child(cli, "store", "dump", str(root))
    assert dump.returncode == 0, dump.stderr[-3000:]
    assert "records: 20" in dump.stdout


def test_store_check_reports_a_commitlog_file_truncated_underneath(tmp_path: Path) -> None:
    """A file cut after the tool sized it: a mapped read past its new end is a SIGBUS;
    the pread reader reports the cut (a record ending past it is corrupt)."""
    from basalt.store.consistency import check_store
    from basalt.store.readonly import ReadOnlyFile

    root = tmp_path / "store"
    config = MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=SMALL_COMMITLOG_FILE,
        mapped_file_size_consume_queue=SMALL_CQ_FILE,
        **SMALL_INDEX,  # type: ignore[arg-type]
    )
    with MessageStore(config) as store:
        for i in range(20):
            assert store.put_message(Message("T", b"y" * 100 + b"%d" % i)).ok
    path = config.commitlog_dir / "00000000000000000000"
    original = ReadOnlyFile.__init__

    def open_then_cut(self: ReadOnlyFile, p: Path, size: int) -> None:
        original(self, p, size)
        if p == path:
            os.truncate(p, 1000)  # underneath the tool, after it checked the size

    ReadOnlyFile.__init__ = open_then_cut  # type: ignore[method-assign]
    try:
        report = check_store(root)
    finally:
        ReadOnlyFile.__init__ = original  # type: ignore[method-assign]
    # Reads stop at the data's end as the file now is (SEEK_DATA/SEEK_HOLE), and a
    # short pread is reported as the file's truncation: either way a finding.
    codes = {p.code for p in report.problems}
    assert codes & {"file-truncated", "commitlog-corrupt"}, report.summary()
    assert not report.ok

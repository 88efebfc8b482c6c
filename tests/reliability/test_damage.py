"""A damaged root loses at most the damaged records and never reissues a queue offset.

Issue 14's contract, tried the way an operator meets a bad disk: one small
store is written and stopped cleanly (module scope), and each entry of
:data:`tests.support.damage.CATALOGUE` damages a fresh copy of it - a flipped
byte in each CommitLog record field, a zeroed page, truncations, a deleted
file, garbage past the end; ConsumeQueue, IndexFile, checkpoint and
consumerOffset.json damage; some again with the ``abort`` file a crash
leaves. The store is restarted on the copy, and:

(a) every record the damage did not touch reads back at its original queue
    offset with its own body (and is found by its key);
(b) reading each queue from 0 never returns a wrong body and never stalls;
(c) the next send to each queue gets the queue's pre-damage max offset;
(d) after a clean stop, ``store check`` passes - or, for damage a start does
    not look for (a file older than the clean-start scan), reports exactly it;
(e) CommitLog damage is listed in the recovery report's ``damaged_spans``,
    and damaged bytes that still existed were copied to ``quarantine/``.

Issue 28 added a lost queue directory, a lost CommitLog (with and without
its queues: the queue manifest keeps their offsets), a flipped byte in a file
older than the clean-start scan (not seen at start: the store starts and every
other record is intact), and a pop journal folder replaced by a file (set
aside: the pop state starts empty and POP_GROUP's messages in flight come
again, :func:`test_a_pop_journal_that_is_not_one_is_set_aside`).

The fsync and EMFILE failures of a running store-node are
tests/reliability/test_store_node_failure.py's (and the store's own,
tests/store/test_failures.py).
"""

from __future__ import annotations

import argparse
import io
import logging
import random
import time
from pathlib import Path

import pytest

from basalt.store import MessageStore
from basalt.store.consistency import check_store
from basalt.store.errors import CorruptFileError
from basalt.store.tools import EXIT_INCONSISTENT, run_check
from tests.support.damage import (
    CATALOGUE,
    DAMAGES,
    POP_GROUP,
    POP_QUEUE,
    POPPED,
    Damage,
    Layout,
    build_store,
    check_as_expected,
    copy_root,
    store_config,
    verify,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Layout]:
    """The undamaged root every test copies, and its layout."""
    root = tmp_path_factory.mktemp("built") / "store"
    return root, build_store(root)


def test_the_built_store_spans_several_files(built: tuple[Path, Layout]) -> None:
    root, layout = built
    assert layout.commitlog_files >= 4
    assert len(layout.records) == sum(layout.queue_max.values())
    config = store_config(root)
    for topic, queue_id in layout.queue_max:
        assert len(list((config.consume_queue_dir / topic / str(queue_id)).iterdir())) >= 3


#: What ``store check`` says of each damage *before* a restart: the codes of the
#: problems it must report (issue 28 point 11: it looked at none of these files).
CHECK_BEFORE_RESTART = {
    "commitlog-longer-than-configured": "file-size",
    "consumequeue-past-its-size": "file-size",
    "pop-folder-replaced-by-file": "pop-journal",
    "pop-journal-replaced-by-folder": "pop-journal",
    "pop-journal-garbage-tail": "pop-journal",
    "index-flip": "index",
    "index-truncate": "index",
    "checkpoint-truncate": "checkpoint",
    "offsets-torn": "consumer-offsets",
    "offsets-both-torn": "consumer-offsets",
    "queue-manifest-flip": "queue-manifest",
    "consumequeue-delete-directory": "cq-lost",
}


@pytest.mark.parametrize("name", sorted(CHECK_BEFORE_RESTART))
def test_store_check_reports_the_damage_before_a_restart(
    built: tuple[Path, Layout], tmp_path: Path, name: str
) -> None:
    source, layout = built
    root = tmp_path / "store"
    copy_root(source, root)
    DAMAGES[name](layout, root, random.Random(name))
    config = store_config(root)
    check = check_store(root, index_geometry=(config.max_hash_slot_num, config.max_index_num))
    assert not check.ok, check.summary()
    assert CHECK_BEFORE_RESTART[name] in {p.code for p in check.problems}, check.summary()


def test_a_commitlog_file_longer_than_configured_is_refused_naming_it(
    built: tuple[Path, Layout], tmp_path: Path
) -> None:
    """The one refusal docs/storage.md keeps: the error names the file and what to do,
    and ``store check`` agrees (exit 1), where it used to pass the root."""
    source, layout = built
    root = tmp_path / "store"
    copy_root(source, root)
    harm = DAMAGES["commitlog-longer-than-configured"](layout, root, random.Random(0))
    assert harm.refused
    with pytest.raises(CorruptFileError, match="start with the file size"):
        MessageStore(store_config(root)).start()
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(root=root, json=False)
    assert run_check(args, out, err) == EXIT_INCONSISTENT, out.getvalue()
    assert "result: INCONSISTENT" in out.getvalue()


@pytest.mark.parametrize(
    "damage",
    [d for d in CATALOGUE if not d.name.startswith("commitlog-longer")],
    ids=lambda d: d.name,
)
def test_a_damaged_root_loses_at_most_the_damaged_records(
    built: tuple[Path, Layout], tmp_path: Path, damage: Damage
) -> None:
    source, layout = built
    root = tmp_path / "store"
    copy_root(source, root)
    harm = damage(layout, root, random.Random(damage.name))
    store = MessageStore(store_config(root))
    report = store.start()
    try:
        outcome = verify(store, layout, harm)
    finally:
        store.shutdown()
    assert not outcome.collateral, (
        f"{len(outcome.collateral)} records lost outside the damage "
        f"(allowed {len(harm.lost)}): {sorted(outcome.collateral)[:5]}; {report.summary()}"
    )
    assert not outcome.wrong, outcome.wrong[:5]
    assert not outcome.reissued, (
        f"queue offsets reissued (queue, got, expected): {outcome.reissued}"
    )
    check = check_store(root)
    assert check_as_expected(check, harm), check.summary()
    if harm.commitlog_span is not None:
        start, end = harm.commitlog_span
        spans = report.damaged_spans  # the resync contract (store/recovery.py)
        listed = [s for s in spans if s.offset < end and s.offset + s.length > start]
        assert listed, f"damage at [{start}, {end}) not in damaged_spans {spans}"
        if harm.quarantined:
            for span in listed:
                quarantine = Path(span.quarantine)
                assert (root / quarantine).is_file(), span


@pytest.mark.parametrize(
    "name",
    [
        "pop-folder-replaced-by-file",
        "pop-journal-replaced-by-folder",
        "pop-folder-replaced-by-file+abort",
    ],
)
def test_a_pop_journal_that_is_not_one_is_set_aside(
    built: tuple[Path, Layout], tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 28 point 4: the store-node exited 2 on this root. Now what is in the
    journal's place goes to quarantine/ (ERROR), and the pop state starts empty:
    the messages that were in flight are delivered again, from the group's
    committed offset, none skipped."""
    source, layout = built
    root = tmp_path / "store"
    copy_root(source, root)
    harm = DAMAGES[name](layout, root, random.Random(name))
    assert harm.pop_lost
    config = store_config(root)
    store = MessageStore(config)
    with caplog.at_level(logging.ERROR, logger="basalt.store.pop"):
        store.start()
    try:
        report = store.pop_load_report
        assert report is not None and report.records == 0 and report.set_aside
        for path in report.set_aside:
            assert Path(path).parent == config.quarantine_dir and Path(path).exists()
        assert any("set aside" in r.getMessage() for r in caplog.records)
        popped = store.pop.pop(POP_GROUP, *POP_QUEUE, 16, 60_000, int(time.time() * 1000))
        offsets = [m.queue_offset for m in popped]
        assert offsets[: len(layout.pop_in_flight)] == list(layout.pop_in_flight)
        assert offsets == list(range(layout.pop_in_flight[0], layout.pop_in_flight[0] + 16))
        assert all(m.attempt == 1 for m in popped)
    finally:
        assert store.shutdown()
    # The journal is a journal again: the next start replays it.
    again = MessageStore(config)
    again.start()
    try:
        assert again.pop_load_report is not None and again.pop_load_report.set_aside == ()
        assert again.pop.cursor(POP_GROUP, *POP_QUEUE) == layout.pop_in_flight[0] + 16
    finally:
        again.shutdown()


def test_an_intact_pop_journal_keeps_its_messages_in_flight(
    built: tuple[Path, Layout], tmp_path: Path
) -> None:
    """The control for the test above: on an undamaged copy the popped messages stay
    invisible and the next pop starts past them."""
    source, layout = built
    root = tmp_path / "store"
    copy_root(source, root)
    store = MessageStore(store_config(root))
    store.start()
    try:
        assert store.pop_load_report is not None
        assert store.pop_load_report.in_flight == len(layout.pop_in_flight)
        popped = store.pop.pop(POP_GROUP, *POP_QUEUE, 4, 60_000, int(time.time() * 1000))
        assert [m.queue_offset for m in popped] == list(range(POPPED, POPPED + 4))
    finally:
        store.shutdown()

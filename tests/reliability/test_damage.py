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
(d) after a clean stop, ``store check`` passes;
(e) CommitLog damage is listed in the recovery report's ``damaged_spans``,
    and damaged bytes that still existed were copied to ``quarantine/``.

The fsync and EMFILE failures of a running store-node are
tests/reliability/test_store_node_failure.py's (and the store's own,
tests/store/test_failures.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from basalt.store import MessageStore
from basalt.store.consistency import check_store
from tests.support.damage import (
    CATALOGUE,
    Damage,
    Layout,
    build_store,
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


@pytest.mark.parametrize("damage", CATALOGUE, ids=lambda d: d.name)
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
    assert check.ok, check.summary()
    if harm.commitlog_span is not None:
        start, end = harm.commitlog_span
        spans = report.damaged_spans  # the resync contract (store/recovery.py)
        listed = [s for s in spans if s.offset < end and s.offset + s.length > start]
        assert listed, f"damage at [{start}, {end}) not in damaged_spans {spans}"
        if harm.quarantined:
            for span in listed:
                quarantine = Path(span.quarantine)
                assert (root / quarantine).is_file(), span

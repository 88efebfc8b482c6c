"""Real-process crash testing of consumer offsets: the child and the model both sides share.

Run as a program this is the **child**::

    python tests/support/offset_writer.py CONFIG_DIR

It loads ``CONFIG_DIR/consumerOffset.json`` (failing with exit status 2 if
the file is not exactly what :func:`expected_tables` says some step left),
then runs steps ``n+1, n+2, ...`` in a tight loop until killed. Step ``s``
commits offset ``s * QUEUES + q`` to every queue ``q`` of every
(group, topic) under its current reset epoch; every ``RESET_EVERY`` steps it
also resets one (group, topic) to those same offsets and checks that a commit
under the epoch before the reset is refused. Then it persists and prints one
JSON line::

    {"event": "ready", "step": n}        after load, before the first step
    {"event": "persisted", "step": s}    after persist() of step s returned

So whatever the file holds is a pure function of one step number, and the
parent (``tests/store/test_consumer_offsets.py``) can check that a file loaded after a
``kill -9`` is exactly some step's snapshot — never a torn mix — and that the
step is the last persisted one or the one after it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from basalt.store.clock import SystemClock
from basalt.store.consumer_offsets import (
    CONSUMER_OFFSET_FILE_NAME,
    CommitStatus,
    ConsumerOffsetManager,
)

GROUPS = tuple(f"crash-group-{i}" for i in range(8))
TOPICS = tuple(f"CrashTopic{i}" for i in range(4))
#: 8 groups x 4 topics x 8 queues: a file of several pages, so a torn write would show.
QUEUES = 8
RESET_EVERY = 5
#: The child gives up on its own after this long, in case its parent is gone.
CHILD_MAX_SECONDS = 60.0

PAIRS = tuple((g, t) for g in GROUPS for t in TOPICS)


def offset_at(step: int, queue_id: int) -> int:
    """The offset every group commits to ``queue_id`` in step ``step``: increasing in steps."""
    return step * QUEUES + queue_id


def reset_pair(step: int) -> tuple[str, str] | None:
    """The (group, topic) step ``step`` resets, if any."""
    if step <= 0 or step % RESET_EVERY:
        return None
    return PAIRS[(step // RESET_EVERY - 1) % len(PAIRS)]


def expected_tables(step: int) -> tuple[dict[str, dict[int, int]], dict[str, int]]:
    """The offset and epoch tables (keyed ``topic@group``) right after step ``step``."""
    if step == 0:
        return {}, {}
    offsets = {f"{t}@{g}": {q: offset_at(step, q) for q in range(QUEUES)} for g, t in PAIRS}
    epochs: dict[str, int] = {}
    for s in range(RESET_EVERY, step + 1, RESET_EVERY):
        pair = reset_pair(s)
        assert pair is not None
        key = f"{pair[1]}@{pair[0]}"
        epochs[key] = epochs.get(key, 0) + 1
    return offsets, epochs


def step_of(manager: ConsumerOffsetManager) -> int:
    """Which step the manager's table is a snapshot of; raises AssertionError if none."""
    group, topic = PAIRS[0]
    first = manager.query_offset(group, topic, 0)
    step = 0 if first < 0 else first // QUEUES
    offsets = {
        f"{t}@{g}": manager.query_offsets(g, t) for g, t in PAIRS if manager.query_offsets(g, t)
    }
    epochs = {f"{t}@{g}": manager.reset_epoch(g, t) for g, t in PAIRS if manager.reset_epoch(g, t)}
    want_offsets, want_epochs = expected_tables(step)
    if offsets != want_offsets or epochs != want_epochs:
        raise AssertionError(
            f"the table is no step's snapshot (closest: step {step}):\n"
            f"offsets {offsets}\nepochs {epochs}"
        )
    return step


def run_step(manager: ConsumerOffsetManager, step: int) -> None:
    for group, topic in PAIRS:
        epoch = manager.reset_epoch(group, topic)
        for queue_id in range(QUEUES):
            result = manager.commit_offset(
                group, topic, queue_id, offset_at(step, queue_id), reset_epoch=epoch
            )
            if not result.ok:
                raise AssertionError(f"step {step}: commit refused: {result}")
    pair = reset_pair(step)
    if pair is not None:
        group, topic = pair
        before = manager.reset_epoch(group, topic)
        after = manager.reset_offsets(group, topic, {q: offset_at(step, q) for q in range(QUEUES)})
        if after != before + 1:
            raise AssertionError(f"step {step}: reset moved the epoch {before} -> {after}")
        stale = manager.commit_offset(group, topic, 0, 0, reset_epoch=before)
        if stale.status is not CommitStatus.STALE_RESET_EPOCH or stale.reset_epoch != after:
            raise AssertionError(f"step {step}: a stale commit got {stale}")


def child_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Commit and persist offsets until killed.")
    parser.add_argument("config_dir", type=Path)
    args = parser.parse_args(argv)

    manager = ConsumerOffsetManager(
        args.config_dir / CONSUMER_OFFSET_FILE_NAME, clock=SystemClock()
    )
    manager.load()
    try:
        step = step_of(manager)
    except AssertionError as e:
        print(e, file=sys.stderr, flush=True)
        return 2
    out = sys.stdout
    out.write(json.dumps({"event": "ready", "step": step}) + "\n")
    out.flush()
    deadline = time.monotonic() + CHILD_MAX_SECONDS
    while time.monotonic() < deadline:
        step += 1
        run_step(manager, step)
        manager.persist()
        out.write(json.dumps({"event": "persisted", "step": step}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(child_main())

"""EMFILE and ENOSPC at each file operation of a running store.

Every case injects the error (tests/support/faults.py) into one os-level
operation on one kind of file while the store runs: a new CommitLog file,
a CommitLog write and flush, a new ConsumeQueue file, a ConsumeQueue write
or flush, a new index file, the checkpoint's flush. What issue 15 asks of
each: sends come to be refused with a status naming the error (through the
failure channel where a background service failed), what was stored stays
readable, and after the disk comes back and the store restarts, every send
that was acknowledged is there. Then consumerOffset.json's save: a commit
answered OK survives a full disk, and a stop that could not save it is not
clean.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from basalt.services.store_node.server import start_store_node
from basalt.services.store_node.service import StoreNodeConfig
from basalt.services.store_node.topics import LocalTopics
from basalt.store import Message, MessageStore, MessageStoreConfig, PutStatus
from basalt.store import index_service as index_service_module
from tests.support.aio import run
from tests.support.faults import FaultInjector, PathMatch, Rule, under
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory, node_store_config

TOPIC = "Exhausted"
FRESH = "Fresh"
BODY = b"x" * 900


@dataclass(frozen=True)
class Case:
    """One operation on one kind of file: ``rules`` are (operation, path predicate)
    pairs failing with the case's errno, installed once the store holds data
    (or before its first send, with ``before_first_send``); ``topic`` is where
    the sends that must come to be refused go."""

    name: str
    code: int
    rules: Callable[[MessageStoreConfig], list[tuple[str, PathMatch]]]
    topic: str = TOPIC
    before_first_send: bool = False


def _new_files_in(directory: Path) -> PathMatch:
    """Files in ``directory`` that do not exist yet: creations, not reopenings."""
    inside = under(directory)
    return lambda path: inside(path) and not path.exists()


def _commitlog(config: MessageStoreConfig) -> Path:
    return config.commitlog_dir


def _fresh_queue(config: MessageStoreConfig) -> Path:
    return config.consume_queue_dir / FRESH


def _index(config: MessageStoreConfig) -> Path:
    return config.store_path_root_dir / "index"


CASES = [
    Case(
        "commitlog-new-file-emfile",
        errno.EMFILE,
        lambda c: [("open", _new_files_in(_commitlog(c)))],
    ),
    Case(
        "commitlog-new-file-enospc",
        errno.ENOSPC,
        # Sparse files are truncated to size, preallocated ones fallocated: either.
        lambda c: [("ftruncate", under(_commitlog(c))), ("posix_fallocate", under(_commitlog(c)))],
    ),
    Case("commitlog-write-enospc", errno.ENOSPC, lambda c: [("pwrite", under(_commitlog(c)))]),
    Case("commitlog-flush-enospc", errno.ENOSPC, lambda c: [("fdatasync", under(_commitlog(c)))]),
    Case(
        "consume-queue-new-file-emfile",
        errno.EMFILE,
        lambda c: [("open", under(_fresh_queue(c)))],
        topic=FRESH,
    ),
    Case(
        "consume-queue-new-file-enospc",
        errno.ENOSPC,
        lambda c: [
            (op, under(_fresh_queue(c))) for op in ("posix_fallocate", "ftruncate", "pwrite")
        ],
        topic=FRESH,
    ),
    Case(
        "consume-queue-write-enospc",
        errno.ENOSPC,
        # Written through pwrite or a mapping flushed by fdatasync: both fail.
        lambda c: [(op, under(c.consume_queue_dir / TOPIC)) for op in ("pwrite", "fdatasync")],
    ),
    Case(
        "index-new-file-emfile",
        errno.EMFILE,
        lambda c: [("open", under(_index(c)))],
        before_first_send=True,
    ),
    Case(
        "index-new-file-enospc",
        errno.ENOSPC,
        lambda c: [("posix_fallocate", under(_index(c)))],
        before_first_send=True,
    ),
    Case(
        "checkpoint-flush-enospc",
        errno.ENOSPC,
        lambda c: [("fdatasync", lambda p: p == c.checkpoint_path.resolve())],
    ),
]


class Sender:
    """Sends and remembers what was acknowledged, per (topic, queue 0)."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.acked: dict[str, list[bytes]] = {}
        self.n = 0

    def send(self, topic: str) -> tuple[PutStatus, str]:
        body = b"%d:" % self.n + BODY
        self.n += 1
        result = self.store.put_message(Message(topic, body))
        if result.ok:
            self.acked.setdefault(topic, []).append(body)
        return result.status, result.detail


def _bodies(store: MessageStore, topic: str) -> list[bytes]:
    out: list[bytes] = []
    while True:
        got = store.get_message("G", topic, 0, len(out), 32)
        batch = [m.body for m in got.decode()]
        if not batch:
            return out
        out.extend(batch)


def exhaustion_config(make_config: ConfigFactory) -> MessageStoreConfig:
    # Flushes every 10 ms whatever was written: a failing flush shows at once.
    return make_config(flush_commit_log_least_pages=0, flush_interval_commit_log_ms=10)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_an_exhausted_file_operation_refuses_sends_keeps_reads_and_loses_nothing(
    case: Case, make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Index creation is retried a second apart (RocketMQ's); not in a test.
    monkeypatch.setattr(index_service_module, "CREATE_RETRY_INTERVAL_S", 0.01)
    config = exhaustion_config(make_config)
    faults = FaultInjector(monkeypatch)
    reason = os.strerror(case.code)
    with MessageStore(config) as store:
        sender = Sender(store)
        rules: list[Rule] = []
        if case.before_first_send:
            rules = [faults.fail(op, case.code, m) for op, m in case.rules(config)]
        for _ in range(5):
            sender.send(TOPIC)
        assert store.dispatcher.wait_until_dispatched()
        if not case.before_first_send:
            rules = [faults.fail(op, case.code, m) for op, m in case.rules(config)]
        refusals: list[tuple[PutStatus, str]] = []

        def refused() -> bool:
            status, detail = sender.send(case.topic)
            if status is not PutStatus.PUT_OK:
                refusals.append((status, detail))
            return bool(refusals)

        # Enough sends to roll a 64 KiB CommitLog file, or a few dispatches.
        eventually_sync(refused, interval_s=0.005, what=f"a send refused ({case.name})")
        status, detail = refusals[0]
        assert any(rule.hits for rule in rules)  # the error came from the injected operation
        assert status in (PutStatus.SERVICE_NOT_AVAILABLE, PutStatus.CREATE_MAPPED_FILE_FAILED)
        assert reason in detail, detail
        if status is PutStatus.SERVICE_NOT_AVAILABLE:
            assert store.failure is not None and not store.healthy
        # What was stored and dispatched before stays readable.
        first = sender.acked[TOPIC][:5]
        assert _bodies(store, TOPIC)[:5] == first
        faults.clear()
    # The disk is back: everything acknowledged is there after a restart.
    with MessageStore(config) as store:
        assert store.healthy
        assert store.dispatcher.wait_until_dispatched()
        for topic, bodies in sender.acked.items():
            assert _bodies(store, topic) == bodies, topic


# -- consumerOffset.json ------------------------------------------------------------------


def _offsets(config: MessageStoreConfig) -> Path:
    return config.store_path_root_dir / "config"


def test_a_commit_answered_ok_survives_a_save_that_met_a_full_disk(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(flush_consumer_offset_interval_ms=20)
    faults = FaultInjector(monkeypatch)
    with MessageStore(config) as store:
        assert store.commit_offset("G", TOPIC, 0, 1).ok
        reserve = _offsets(config) / "consumerOffset.json.reserve"
        eventually_sync(reserve.exists, what="the space reserve made by the first save")
        # The disk fills: the next save's new copy is refused once, the released
        # reserve makes the room it needs.
        rule = faults.fail("open", errno.ENOSPC, under(_offsets(config)), times=1)
        assert store.commit_offset("G", TOPIC, 0, 7).ok
        eventually_sync(lambda: bool(rule.hits), what="the save that met the full disk")
        eventually_sync(lambda: not store.consumer_offsets.dirty, what="the save retried")
        assert store.shutdown()
    assert not config.abort_path.exists()
    with MessageStore(config) as store:
        assert store.query_offset("G", TOPIC, 0) == 7


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENOSPC], ids=errno.errorcode.get)
def test_offsets_saved_once_the_error_is_gone_and_a_stop_that_cannot_save_is_not_clean(
    code: int, make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(flush_consumer_offset_interval_ms=20)
    faults = FaultInjector(monkeypatch)
    with MessageStore(config) as store:
        assert store.commit_offset("G", TOPIC, 0, 3).ok
        eventually_sync(lambda: not store.consumer_offsets.dirty, what="the first save")
        # Every attempt fails (a reserve cannot cure EMFILE, nor a disk that stays full).
        rule = faults.fail("open", code, under(_offsets(config)))
        assert store.commit_offset("G", TOPIC, 0, 5).ok
        eventually_sync(lambda: len(rule.hits) >= 2, what="saves failing on the timer")
        assert store.put_message(Message(TOPIC, b"sends go on")).ok
        faults.clear()  # the error goes: the timer's next save makes it
        eventually_sync(lambda: not store.consumer_offsets.dirty, what="the save once possible")
        assert store.commit_offset("G", TOPIC, 0, 9).ok
        faults.fail("open", code, under(_offsets(config)))
        # The last save fails: the stop is not clean, abort stays, commit 9 is lost loudly.
        assert not store.shutdown()
        assert store.failure is not None
        assert store.failure.service == "persist-consumer-offsets"
    assert config.abort_path.exists()
    faults.clear()
    with MessageStore(config) as store:
        assert store.healthy
        assert store.query_offset("G", TOPIC, 0) == 5


def test_a_store_node_whose_store_stops_unclean_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = FaultInjector(monkeypatch)

    async def scenario() -> bool:
        running = await start_store_node(
            StoreNodeConfig(broker_name="broker-a"),
            node_store_config(tmp_path / "store"),
            LocalTopics(),
        )
        store = running.store
        assert store.commit_offset("G", TOPIC, 0, 4).ok
        faults.fail("open", errno.ENOSPC, under(_offsets(store.config)))
        return await running.stop(grace_s=0.1)

    # main() turns this into exit status 1.
    assert run(scenario) is False
    assert (tmp_path / "store" / "abort").exists()

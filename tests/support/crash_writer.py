"""Real-process crash testing of the store: the child writer and the parent's cycle logic.

Run as a program this is the **child**::

    python tests/support/crash_writer.py ROOT --seed S [--threads N]

It opens a :class:`MessageStore` on ROOT with SYNC flush and small files (so
CommitLog and ConsumeQueue files roll often) and writes forever from several
threads (so group commit batches concurrent sends): batches of 1-8 messages
over a few topics and queues, with tags, keys and random body sizes (empty
ones, small ones, a few multi-KiB). It speaks JSON lines on stdout, one
``write`` + ``flush`` per line group, so the parent only ever sees whole
lines of acknowledged sends::

    {"event": "starting", "pid": 123}                      before start()
    {"event": "ready", "pid": 123, "recovery": {...}}      RecoveryReport.as_dict()
    {"event": "ack", "topic": ..., "queue_id": ..., ...}   one per PUT_OK message
    {"event": "nack", "status": ..., "detail": ...}        a send that was not PUT_OK

A send is reported only after ``put_messages`` returned PUT_OK, i.e. after
its bytes were fsynced: an ``ack`` line is the promise the parent checks.

Imported as a module (by the crash test and ``benchmarks/crash_loop.py``) it
offers the **parent** side: :class:`CrashLoop` starts the child on one root,
lets it write for a seeded random while, ``SIGKILL``s it, collects every
acknowledgement (including lines read after the kill), then opens the store
itself (abnormal recovery, since ``abort`` was left behind) and checks that
every acknowledged message so far is present, decodable and reachable through
its ConsumeQueue, shuts down cleanly and runs ``basalt store check``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from basalt.store import FlushDiskType, Message, MessageRecord, MessageStore, MessageStoreConfig
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.recovery import RecoveryReport

THIS_FILE = Path(__file__).resolve()
#: The repository root: the working directory of the ``basalt`` it runs.
REPO_ROOT = THIS_FILE.parents[2]

#: Small files so every cycle rolls CommitLog and ConsumeQueue files.
COMMITLOG_FILE_SIZE = 64 * 1024
CQ_FILE_SIZE = 64 * CQ_STORE_UNIT_SIZE
TOPICS = ("CrashTopicA", "CrashTopicB", "%RETRY%crash-group")
QUEUES_PER_TOPIC = 4
TAGS = ("TagA", "TagB", "TagC", None)
#: The child gives up on its own after this long, in case its parent is gone.
CHILD_MAX_SECONDS = 120.0


def store_config(root: Path) -> MessageStoreConfig:
    """The configuration both the child and the parent open ROOT with."""
    return MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=COMMITLOG_FILE_SIZE,
        mapped_file_size_consume_queue=CQ_FILE_SIZE,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        flush_interval_consume_queue_ms=20,
        # A slow CI disk must not turn an fsync into FLUSH_DISK_TIMEOUT.
        sync_flush_timeout_ms=30_000,
        max_hash_slot_num=512,
        max_index_num=2048,
    )


def body_digest(body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=16).hexdigest()


# -- the child ---------------------------------------------------------------------------


class _Output:
    """JSON lines on stdout, one locked write + flush per group so lines never interleave."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def emit(self, *objects: dict[str, Any]) -> None:
        data = b"".join(json.dumps(o, separators=(",", ":")).encode() + b"\n" for o in objects)
        with self._lock:
            self._stream.write(data)
            self._stream.flush()


def _random_body(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.10:
        return b""
    if roll < 0.75:
        return rng.randbytes(rng.randint(1, 256))
    if roll < 0.95:
        return rng.randbytes(rng.randint(257, 2048))
    return rng.randbytes(rng.randint(2049, 12 * 1024))


def _writer(
    store: MessageStore, out: _Output, seed: int, thread_no: int, stop: threading.Event
) -> None:
    """Send random batches until ``stop``; report each acknowledged message."""
    rng = random.Random(f"{seed}/{thread_no}")
    counter = 0
    while not stop.is_set():
        topic = rng.choice(TOPICS)
        queue_id = rng.randrange(QUEUES_PER_TOPIC)
        mixed = rng.random() < 0.2  # most batches go to one queue, like a producer's
        batch: list[Message] = []
        for _ in range(rng.randint(1, 8)):
            if mixed:
                topic, queue_id = rng.choice(TOPICS), rng.randrange(QUEUES_PER_TOPIC)
            key = f"s{seed}-t{thread_no}-n{counter}"
            counter += 1
            keys = [key] if rng.random() < 0.7 else [key, f"shared-{rng.randrange(10)}"]
            batch.append(
                Message(
                    topic=topic,
                    queue_id=queue_id,
                    body=_random_body(rng),
                    tags=rng.choice(TAGS),
                    keys=keys,
                    properties={"writer": f"{seed}/{thread_no}"},
                )
            )
        result = store.put_messages(batch)
        if not result.ok:
            out.emit({"event": "nack", "status": result.status.value, "detail": result.detail})
            continue
        out.emit(
            *(
                {
                    "event": "ack",
                    "topic": m.topic,
                    "queue_id": m.queue_id,
                    "queue_offset": qo,
                    "physical_offset": po,
                    "size": size,
                    "key": m.keys[0],
                    "tags": m.tags,
                    "digest": body_digest(m.body),
                    "body_len": len(m.body),
                }
                for m, qo, po, size in zip(
                    batch, result.queue_offsets, result.physical_offsets, result.sizes, strict=True
                )
            )
        )


def child_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write to a store until killed.")
    parser.add_argument("root", type=Path)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--threads", type=int, default=3)
    args = parser.parse_args(argv)

    out = _Output(sys.stdout.buffer)
    out.emit({"event": "starting", "pid": os.getpid()})
    store = MessageStore(store_config(args.root))
    report = store.start()
    out.emit({"event": "ready", "pid": os.getpid(), "recovery": report.as_dict()})

    stop = threading.Event()
    failed = threading.Event()

    def run(thread_no: int) -> None:
        try:
            _writer(store, out, args.seed, thread_no, stop)
        except BaseException as e:
            failed.set()
            print(f"writer {thread_no} failed: {e!r}", file=sys.stderr, flush=True)
            raise

    threads = [
        threading.Thread(target=run, args=(n,), name=f"writer-{n}", daemon=True)
        for n in range(args.threads)
    ]
    for t in threads:
        t.start()
    # Wait to be killed; stop on our own only if a writer died or the parent is long gone.
    failed.wait(CHILD_MAX_SECONDS)
    stop.set()
    for t in threads:
        t.join()
    store.shutdown()
    return 3 if failed.is_set() else 0


# -- the parent --------------------------------------------------------------------------


class CrashCheckFailure(AssertionError):
    """A crash cycle broke a promise: an acknowledged message lost, or an inconsistent store."""


@dataclass(frozen=True, slots=True)
class Ack:
    """One message the child reported as acknowledged (PUT_OK, fsynced)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    key: str
    tags: str | None
    digest: str
    body_len: int
    cycle: int

    @classmethod
    def from_line(cls, line: dict[str, Any], cycle: int) -> Ack:
        return cls(
            topic=line["topic"],
            queue_id=line["queue_id"],
            queue_offset=line["queue_offset"],
            physical_offset=line["physical_offset"],
            size=line["size"],
            key=line["key"],
            tags=line["tags"],
            digest=line["digest"],
            body_len=line["body_len"],
            cycle=cycle,
        )


@dataclass(frozen=True, slots=True)
class KillResult:
    """One child run, ended by SIGKILL."""

    seed: int
    #: Killed while starting (maybe mid-recovery) rather than while writing.
    early: bool
    #: Whether the child reported ready (and so had created ``abort``) before the kill.
    ready: bool
    acks: int
    nacks: int
    #: The child's own RecoveryReport, from its ready line.
    child_recovery: dict[str, Any] | None


@dataclass(slots=True)
class CycleResult:
    """One cycle: one or more kills in a row, then the parent's recovery and checks."""

    cycle: int
    kills: list[KillResult]
    #: The parent's recovery after the last kill.
    recovery: RecoveryReport | None = None
    #: Acknowledged messages (of all cycles so far) found intact.
    verified: int = 0
    #: The checker's report on the cleanly shut down root (None without a checker).
    check_report: dict[str, Any] | None = None

    @property
    def acks(self) -> int:
        return sum(k.acks for k in self.kills)

    @property
    def nacks(self) -> int:
        return sum(k.nacks for k in self.kills)

    @property
    def early_kills(self) -> int:
        return sum(k.early for k in self.kills)


@dataclass(slots=True)
class _ChildOutput:
    """Lines read from the child's stdout by a background thread."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    eof: bool = False
    garbage: list[bytes] = field(default_factory=list)
    events: set[str] = field(default_factory=set)

    def read_all(self, stream: IO[bytes]) -> None:
        for raw in stream:
            if not raw.endswith(b"\n"):
                break  # a line cut short by the kill: never acknowledged to us
            try:
                line = json.loads(raw)
            except ValueError:
                self.garbage.append(raw)
                continue
            with self.cond:
                self.lines.append(line)
                if line.get("event") not in self.events:
                    self.events.add(line.get("event"))
                    self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait_for(self, event: str, timeout_s: float) -> bool:
        """Block until a line of ``event`` arrived; False on EOF or timeout."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while event not in self.events:
                remaining = deadline - time.monotonic()
                if self.eof or remaining <= 0:
                    return False
                self.cond.wait(remaining)
            return True


def run_store_check_cli(root: Path) -> dict[str, Any]:
    """Run ``python -m basalt.admin store check ROOT --json`` (``basalt store check``).

    Returns the parsed report; raises CrashCheckFailure on a non-zero exit, a
    report that is not ``ok``, or records left undispatched after a clean shutdown.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "basalt.admin", "store", "check", str(root), "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        # Its own cap, not tests.support.timeouts': this module runs by path and is
        # loaded by path by benchmarks/crash_loop.py (whose roots are larger), so
        # it imports nothing from the tests package.
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        raise CrashCheckFailure(
            f"`basalt store check {root}` exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    report: dict[str, Any] = json.loads(proc.stdout)
    if not report["ok"] or report["counts"]["undispatched_records"] != 0:
        raise CrashCheckFailure(f"`basalt store check {root}` exited 0 but reported {report}")
    return report


#: Checks a cleanly shut down root; returns its report as a dict, raises CrashCheckFailure.
StoreChecker = Callable[[Path], dict[str, Any]]


class CrashLoop:
    """Kill a SYNC-flush writer again and again on one root and check what survived.

    ``run_cycle(n)`` does one cycle — one kill, sometimes two or three in a
    row (the later children recover abnormally themselves), then the parent's
    own abnormal recovery, a check of every acknowledged message of every
    cycle so far, a clean shutdown and ``checker`` — and raises
    :class:`CrashCheckFailure` when a promise is broken. A seed fixes every
    choice except where the kill lands in the child's work.
    """

    def __init__(
        self,
        root: Path,
        *,
        seed: int,
        threads: int = 3,
        min_run_ms: int = 20,
        max_run_ms: int = 300,
        early_kill_probability: float = 0.1,
        repeat_kill_probability: float = 0.3,
        checker: StoreChecker | None = run_store_check_cli,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.root = root
        self.seed = seed
        self.threads = threads
        self.min_run_ms = min_run_ms
        self.max_run_ms = max_run_ms
        self.early_kill_probability = early_kill_probability
        self.repeat_kill_probability = repeat_kill_probability
        self.checker = checker
        self.ready_timeout_s = ready_timeout_s
        self.rng = random.Random(seed)
        #: Every acknowledged message of every cycle, by its unique key.
        self.acked: dict[str, Ack] = {}
        #: (topic, queue id, queue offset) of every record a recovery lost to
        #: damage (a torn append the kill left at the log's end) and kept the
        #: slot of: those offsets stay taken, never issued again (docs/storage.md).
        self.kept_slots: set[tuple[str, int, int]] = set()
        self.config = store_config(root)

    # -- one cycle --------------------------------------------------------------------

    def run_cycle(self, cycle: int) -> CycleResult:
        """Kill the child one or more times in a row, then verify and check the store.

        Raises CrashCheckFailure when a promise is broken.
        """
        kills = [self._kill_child(cycle, 0)]
        # Sometimes crash again before any clean shutdown: the next child then runs an
        # abnormal recovery itself, and may be killed in the middle of it.
        while len(kills) < 3 and self.rng.random() < self.repeat_kill_probability:
            kills.append(self._kill_child(cycle, len(kills)))
        result = CycleResult(cycle, kills)
        result.recovery, result.verified = self.verify(expect_abort=any(k.ready for k in kills))
        if self.checker is not None:
            result.check_report = report = self.checker(self.root)
            records = report["counts"]["records"]
            if records < len(self.acked):
                raise CrashCheckFailure(
                    f"cycle {cycle}: the checker counts {records} records but "
                    f"{len(self.acked)} were acknowledged"
                )
        return result

    def _kill_child(self, cycle: int, round_no: int) -> KillResult:
        """Start the child, SIGKILL it at a random point, record what it acknowledged."""
        child_seed = (self.seed * 10_000 + cycle) * 10 + round_no
        where = f"cycle {cycle} kill {round_no} (child seed {child_seed})"
        early = self.rng.random() < self.early_kill_probability
        run_s = self.rng.uniform(self.min_run_ms, self.max_run_ms) / 1000
        early_s = self.rng.uniform(0, 0.05)
        self.root.mkdir(parents=True, exist_ok=True)
        abort_before = self.config.abort_path.exists()
        stderr_path = self.root.parent / f"{self.root.name}-child.stderr"
        with stderr_path.open("wb") as stderr:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(THIS_FILE),
                    str(self.root),
                    "--seed",
                    str(child_seed),
                    "--threads",
                    str(self.threads),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
            assert proc.stdout is not None
            output = _ChildOutput()
            reader = threading.Thread(target=output.read_all, args=(proc.stdout,), daemon=True)
            reader.start()
            try:
                if early:
                    output.wait_for("starting", self.ready_timeout_s)
                    time.sleep(early_s)
                elif output.wait_for("ready", self.ready_timeout_s) and output.wait_for(
                    "ack", self.ready_timeout_s
                ):
                    # Past the first acknowledgement, so every such kill cuts a writer
                    # mid-stream however slow the machine.
                    time.sleep(run_s)
                died_early = proc.poll() is not None
                if not died_early:
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                reader.join()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                proc.stdout.close()
        stderr_text = stderr_path.read_text(errors="replace")
        if died_early or proc.returncode != -signal.SIGKILL:
            raise CrashCheckFailure(
                f"{where}: the child exited with {proc.returncode} before it was killed\n"
                f"stderr:\n{stderr_text}"
            )
        stderr_path.unlink()
        if output.garbage:
            raise CrashCheckFailure(f"{where}: unparsable child output {output.garbage!r}")
        ready_lines = [line for line in output.lines if line.get("event") == "ready"]
        if not early and "ack" not in output.events:
            raise CrashCheckFailure(
                f"{where}: no ready line, or no acknowledgement after it, within "
                f"{self.ready_timeout_s} s\nstderr:\n{stderr_text}"
            )
        child_recovery = ready_lines[0]["recovery"] if ready_lines else None
        if child_recovery is not None:
            self._check_child_recovery(where, child_recovery, abnormal=abort_before)
        acks = nacks = 0
        for line in output.lines:
            if line.get("event") == "ack":
                ack = Ack.from_line(line, cycle)
                if ack.key in self.acked:
                    raise CrashCheckFailure(f"{where}: key {ack.key} acknowledged twice")
                self.acked[ack.key] = ack
                acks += 1
            elif line.get("event") == "nack":
                nacks += 1
        return KillResult(
            seed=child_seed,
            early=early,
            ready=bool(ready_lines),
            acks=acks,
            nacks=nacks,
            child_recovery=child_recovery,
        )

    @staticmethod
    def _check_child_recovery(where: str, report: dict[str, Any], *, abnormal: bool) -> None:
        """The child's recovery is abnormal iff ``abort`` was there; after a clean stop a no-op."""
        if report["abnormal"] != abnormal:
            raise CrashCheckFailure(
                f"{where}: child recovery abnormal={report['abnormal']} with abort file "
                f"present={abnormal}: {report}"
            )
        if abnormal:
            return
        changed = [
            f"{name}={report[name]!r}"
            for name in (
                "bytes_truncated",
                "consume_queue_entries_dropped",
                "consume_queue_entries_rebuilt",
                "consume_queues_destroyed",
            )
            if report[name] != 0
        ]
        if changed:
            raise CrashCheckFailure(
                f"{where}: the child's recovery after a clean shutdown changed something: "
                f"{', '.join(changed)}: {report}"
            )

    # -- verification -----------------------------------------------------------------

    def verify(self, *, expect_abort: bool) -> tuple[RecoveryReport, int]:
        """Open the store (recovering), check every acknowledged message, shut down cleanly.

        ``expect_abort``: the child got as far as creating ``abort``, so this
        recovery must be abnormal. Returns the recovery report and the number
        of messages verified.
        """
        abort_left = self.config.abort_path.exists()
        if expect_abort and not abort_left:
            raise CrashCheckFailure("the killed child left no 'abort' file behind")
        store = MessageStore(self.config)
        report = store.start()
        try:
            if report.abnormal != abort_left:
                raise CrashCheckFailure(
                    f"recovery abnormal={report.abnormal} with abort file present={abort_left}"
                )
            self.kept_slots.update(
                (span.topic, span.queue_id, span.queue_offset)
                for span in report.damaged_spans
                if span.topic is not None
                and span.queue_id is not None
                and span.queue_offset is not None
            )
            problems = self._check_acked(store, report)
            problems += self._check_queues(store)
            if problems:
                shown = "\n  ".join(problems[:40])
                raise CrashCheckFailure(
                    f"{len(problems)} problems after recovery ({report.summary()}):\n  {shown}"
                )
        finally:
            store.shutdown()
        if self.config.abort_path.exists():
            raise CrashCheckFailure("a clean shutdown left the 'abort' file behind")
        return report, len(self.acked)

    def _check_acked(self, store: MessageStore, report: RecoveryReport) -> list[str]:
        problems: list[str] = []
        by_queue: dict[tuple[str, int], set[int]] = {}
        for ack in self.acked.values():
            where = f"{ack.key} ({ack.topic}/{ack.queue_id}@{ack.queue_offset}, cycle {ack.cycle})"
            offsets = by_queue.setdefault((ack.topic, ack.queue_id), set())
            if ack.queue_offset in offsets:
                problems.append(f"{where}: queue offset acknowledged twice")
            offsets.add(ack.queue_offset)
            if ack.physical_offset + ack.size > report.last_valid_offset:
                problems.append(
                    f"{where}: ends at {ack.physical_offset + ack.size}, past the recovered "
                    f"end {report.last_valid_offset}"
                )
            try:
                record = store.get_message_by_queue_offset(
                    ack.topic, ack.queue_id, ack.queue_offset
                )
                direct = store.lookup_message_by_offset(ack.physical_offset)
            except Exception as e:
                problems.append(f"{where}: cannot be read: {e!r}")
                continue
            if record is None:
                problems.append(f"{where}: not reachable through its ConsumeQueue")
                continue
            problems += [f"{where}: {p}" for p in _compare(ack, record)]
            if direct != record:
                problems.append(f"{where}: by physical offset {direct!r} != by queue offset")
        for (topic, queue_id), offsets in by_queue.items():
            max_offset = store.get_max_offset_in_queue(topic, queue_id)
            if max_offset < max(offsets) + 1:
                problems.append(
                    f"{topic}/{queue_id}: max offset {max_offset} < highest acknowledged "
                    f"{max(offsets)} + 1"
                )
        return problems

    def _past_kept(self, topic: str, queue_id: int, offset: int) -> int:
        """``offset``, or past the kept slots of lost records that start there."""
        while (topic, queue_id, offset) in self.kept_slots:
            offset += 1
        return offset

    def _check_queues(self, store: MessageStore) -> list[str]:
        """Every queue we write: consecutive offsets (but for the kept slots of
        records lost to damage), records of that queue, unique keys."""
        problems: list[str] = []
        for topic in TOPICS:
            for queue_id in range(QUEUES_PER_TOPIC):
                expected = self._past_kept(
                    topic, queue_id, store.get_min_offset_in_queue(topic, queue_id)
                )
                seen: set[str] = set()
                for queue_offset, record in store.iter_queue(topic, queue_id, expected):
                    where = f"{topic}/{queue_id}@{queue_offset}"
                    if queue_offset != expected:
                        problems.append(f"{where}: expected queue offset {expected}")
                    expected = self._past_kept(topic, queue_id, queue_offset + 1)
                    if (record.topic, record.queue_id, record.queue_offset) != (
                        topic,
                        queue_id,
                        queue_offset,
                    ):
                        problems.append(
                            f"{where}: points at {record.topic}/{record.queue_id}"
                            f"@{record.queue_offset}"
                        )
                    key = record.keys[0] if record.keys else ""
                    if key in seen:
                        problems.append(f"{where}: key {key!r} stored twice in the queue")
                    seen.add(key)
                max_offset = store.get_max_offset_in_queue(topic, queue_id)
                if expected != max_offset:
                    problems.append(
                        f"{topic}/{queue_id}: iteration ended at {expected}, max offset "
                        f"{max_offset}"
                    )
        return problems


def _compare(ack: Ack, record: MessageRecord) -> list[str]:
    problems = []
    for name, want, got in (
        ("topic", ack.topic, record.topic),
        ("queue id", ack.queue_id, record.queue_id),
        ("queue offset", ack.queue_offset, record.queue_offset),
        ("physical offset", ack.physical_offset, record.commit_log_offset),
        ("size", ack.size, record.store_size),
        ("tags", ack.tags, record.tags),
        ("body length", ack.body_len, len(record.body)),
        ("body digest", ack.digest, body_digest(record.body)),
    ):
        if want != got:
            problems.append(f"{name} {got!r}, acknowledged {want!r}")
    if ack.key not in record.keys:
        problems.append(f"keys {record.keys!r} lack {ack.key!r}")
    return problems


if __name__ == "__main__":
    sys.exit(child_main())

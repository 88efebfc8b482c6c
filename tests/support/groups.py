"""A broker group as real processes: N store-node members of ``broker-a`` on one
etcd, each its own process with its own store root, and what a test does to
them (kill -9, SIGSTOP/SIGCONT, SIGTERM, restart) and asks of them (the group
state in etcd, sends and reads over StoreNode's gRPC, the CommitLog's bytes).

Used by ``tests/services/store_node/ha/test_group_*.py`` and by the fault loop
(:mod:`tests.support.fault_loop`'s place is this module's second half:
:class:`FaultLoop`), which ``benchmarks/replication_faults.py`` loads by path.
So this module imports nothing from ``tests``: only ``basalt`` and the standard
library (benchmarks do not depend on the tests package).

Every member runs with small timings (a 2 s lease, a 2 s catch-up limit) and
small store files (64 KiB CommitLog files), so a failover takes a few seconds
and the files roll.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from basalt.common.record import decode_record, split_records
from basalt.common.status import master_address_of, response_code_of
from basalt.services.cluster.etcd import EtcdProcess, free_port
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.services.meta.group_model import GroupState, MemberRegistration
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.processes import signal_and_wait

THIS_FILE = Path(__file__).resolve()
#: The repository root: the working directory of every member.
REPO_ROOT = THIS_FILE.parents[2]

#: The group's broker name, and the topic the helpers write.
GROUP = "broker-a"
TOPIC = "HA"
QUEUES = 2
#: Small CommitLog files: a test's few hundred KiB roll several.
COMMITLOG_FILE_SIZE = 64 << 10
#: How long a wait on a child process may take before it is a hang.
PROCESS_TIMEOUT_S = 60.0


def ha_flags(
    *,
    ack_mode: str = "SYNC",
    min_in_sync: int = 2,
    lease_ttl_s: int = 2,
    fence_margin_ms: int = 700,
    not_catchup_ms: int = 2000,
    offset_sync_ms: int = 500,
    sync_flush_timeout_ms: int = 1000,
    unclean: bool = False,
) -> tuple[str, ...]:
    """A member's replication and store flags: small timings, small files."""
    return (
        "--replica-ack-mode", ack_mode,
        "--min-in-sync-replicas", str(min_in_sync),
        "--ha-lease-ttl-s", str(lease_ttl_s),
        "--lease-ttl-s", str(lease_ttl_s),
        "--ha-fence-margin-ms", str(fence_margin_ms),
        "--ha-max-time-slave-not-catchup-ms", str(not_catchup_ms),
        "--ha-offset-sync-interval-ms", str(offset_sync_ms),
        "--ha-heartbeat-interval-ms", "100",
        "--sync-flush-timeout-ms", str(sync_flush_timeout_ms),
        "--enable-elect-unclean-master", "true" if unclean else "false",
        "--mapped-file-size-commit-log", str(COMMITLOG_FILE_SIZE),
        "--max-hash-slot-num", "1000",
        "--max-index-num", "4000",
        "--default-topic-queue-nums", str(QUEUES),
    )  # fmt: skip


class Member:
    """One member's process: ``python -m basalt.services.store_node.main`` as
    ``broker-a`` with ``--broker-id``, on a fixed port (a restart keeps it), its
    store in ``directory/<broker>-<id>`` and its stderr in ``<broker>-<id>.log``."""

    def __init__(
        self, directory: Path, broker_id: int, etcd: str, cluster: str, flags: Sequence[str]
    ) -> None:
        self.broker_id = broker_id
        self.port = free_port()
        self.root = directory / f"{GROUP}-{broker_id}"
        self.log = directory / f"{GROUP}-{broker_id}.log"
        self.args = [
            sys.executable, "-m", "basalt.services.store_node.main",
            "--listen", self.address,
            "--name", GROUP,
            "--broker-id", str(broker_id),
            "--data-dir", str(self.root),
            "--etcd", etcd,
            "--cluster", cluster,
            *flags,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Spawn it (its stderr appended to its log); :meth:`wait_serving` next."""
        assert not self.alive, f"member {self.broker_id} is running"
        with self.log.open("ab") as stderr:
            self.proc = subprocess.Popen(
                self.args, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO_ROOT
            )
        self.paused = False

    def wait_serving(self) -> None:
        """Block until it says it serves (it has joined its group by then)."""
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert f"serving on {self.address}" in line, f"member {self.broker_id}: {line!r}"

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=PROCESS_TIMEOUT_S)
        self.paused = False

    def terminate(self) -> int:
        """SIGTERM (a master hands over first); returns its exit status. A member
        still running after PROCESS_TIMEOUT_S gets SIGQUIT first (faulthandler
        writes every thread's stack to its log: what it hung on), then SIGKILL:
        -9."""
        assert self.proc is not None
        if self.paused:
            self.resume()
        code = signal_and_wait(self.proc, signal.SIGTERM, PROCESS_TIMEOUT_S)
        return -9 if code is None else code

    def log_tail(self, lines: int = 60) -> str:
        """The last ``lines`` of its log, for an assertion's message."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def restart(self) -> None:
        self.start()
        self.wait_serving()

    def commitlog(self) -> dict[str, bytes]:
        """The CommitLog's files by name, read now (quiesce the group first)."""
        return {p.name: p.read_bytes() for p in sorted((self.root / "commitlog").iterdir())}


def commitlog_bytes(files: dict[str, bytes]) -> bytes:
    """The CommitLog as one stream, its zero tail cut (a preallocated file's
    unwritten end; a truncation zeroes what it cuts)."""
    return b"".join(files[name] for name in sorted(files)).rstrip(b"\0")


@dataclass(frozen=True, slots=True)
class Sent:
    """A send's outcome: the body, and (for an answer) status, queue and offset."""

    body: bytes
    status: int  # pb.SendStatus, or 0 when refused
    queue_id: int = -1
    queue_offset: int = -1
    code: int = -1  # the refusal's response code
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == pb.SEND_STATUS_SEND_OK


class ReplicaGroup:
    """``replicas`` members of ``broker-a`` on ``etcd`` as ``cluster``; ``async
    with`` starts them (and creates topic HA on the group), leaving kills all."""

    def __init__(
        self,
        directory: Path,
        etcd: str,
        cluster: str,
        *,
        replicas: int = 3,
        flags: Sequence[str] = (),
        on_spawn: Callable[[Member], None] | None = None,
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.etcd = etcd
        self.cluster = cluster
        self.members = {i: Member(directory, i, etcd, cluster, flags) for i in range(replicas)}
        self._on_spawn = on_spawn
        self.meta = MetaClient(MetaConfig(endpoints=(etcd,), cluster=cluster, op_timeout_s=2.0))
        self._channels: dict[int, grpc.aio.Channel] = {}

    async def __aenter__(self) -> ReplicaGroup:
        await self.meta.connect()
        await self.meta.create_topic(
            TopicConfig(
                topic_name=TOPIC, read_queue_nums=QUEUES, write_queue_nums=QUEUES, brokers=(GROUP,)
            )
        )
        for m in self.members.values():
            m.start()
            if self._on_spawn is not None:
                self._on_spawn(m)
        await asyncio.gather(*(asyncio.to_thread(m.wait_serving) for m in self.members.values()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.kill_all()
        for channel in self._channels.values():
            await channel.close()
        await self.meta.close()

    def kill_all(self) -> None:
        for m in self.members.values():
            m.kill()

    async def restart(self, broker_id: int) -> None:
        """Start member ``broker_id`` again and wait until it serves. Its channel
        is replaced: the old one may still be backing off from the refused
        connections of while it was down."""
        channel = self._channels.pop(broker_id, None)
        if channel is not None:
            await channel.close()
        await asyncio.to_thread(self.members[broker_id].restart)

    # -- the group in etcd ----------------------------------------------------------

    async def view(self) -> tuple[GroupState | None, dict[int, MemberRegistration]]:
        """The group state and the live members' registrations, read now."""
        return await self.meta.get_group(GROUP)

    async def state(self) -> GroupState:
        state, _ = await self.view()
        assert state is not None, "no group state"
        return state

    async def master_ready(self, *, above_epoch: int = 0, not_id: int | None = None) -> bool:
        """A master of an epoch above ``above_epoch`` (other than ``not_id``) is
        named, live, and takes sends (a send to it is answered, not refused)."""
        try:
            state, members = await self.view()
        except Exception:
            return False
        if state is None or state.epoch <= above_epoch or state.master_id == not_id:
            return False
        if state.master_id not in members:
            return False
        return (await self.send(state.master_id, b"probe")).status != 0

    async def in_sync(self, ids: set[int]) -> bool:
        """The in-sync set is exactly ``ids``, each of them live."""
        state, members = await self.view()
        return state is not None and state.sync_state_set == ids and ids <= set(members)

    # -- StoreNode calls ------------------------------------------------------------

    def stub(self, broker_id: int) -> sn_grpc.StoreNodeAsyncStub:
        channel = self._channels.get(broker_id)
        if channel is None:
            channel = grpc.aio.insecure_channel(self.members[broker_id].address)
            self._channels[broker_id] = channel
        return sn_grpc.StoreNodeStub(channel)

    async def send(
        self, broker_id: int, body: bytes, queue_id: int = 0, *, timeout_s: float = 5.0
    ) -> Sent:
        """SendMessage of ``body`` to member ``broker_id``: its answer, or its
        refusal (status 0, the response code and message; -1 when the call
        failed without one: down, or no answer in ``timeout_s``)."""
        request = sn.SendMessageRequest(
            message=pb.Message(topic=TOPIC, body=body), queue_id=queue_id
        )
        try:
            r = (await self.stub(broker_id).SendMessage(request, timeout=timeout_s)).result
        except grpc.aio.AioRpcError as e:
            code = response_code_of(e)
            return Sent(body, 0, code=-1 if code is None else code, message=e.details() or "")
        return Sent(body, r.status, r.queue.queue_id, r.queue_offsets[0])

    async def read_queue(self, broker_id: int, queue_id: int) -> list[tuple[int, bytes]]:
        """Every (queue offset, body) of a queue of TOPIC on member ``broker_id``
        (what it has dispatched: up to its confirm offset), from offset 0."""
        got: list[tuple[int, bytes]] = []
        offset = 0
        while True:
            r = await self.stub(broker_id).GetMessage(
                sn.GetMessageRequest(
                    group="reader", topic=TOPIC, queue_id=queue_id, offset=offset, max_msg_nums=64
                ),
                timeout=10,
            )
            if r.status != pb.GET_MESSAGE_STATUS_FOUND:
                return got
            for raw in split_records(r.records.data):
                record = decode_record(raw)
                got.append((record.queue_offset, record.body))
            assert r.next_begin_offset > offset
            offset = r.next_begin_offset

    async def read_all(self, broker_id: int) -> dict[tuple[int, int], bytes]:
        """Every queue of TOPIC on member ``broker_id``: body by (queue, offset)."""
        out: dict[tuple[int, int], bytes] = {}
        for q in range(QUEUES):
            for offset, body in await self.read_queue(broker_id, q):
                out[(q, offset)] = body
        return out


def missing(acked: Sequence[Sent], read: dict[tuple[int, int], bytes]) -> list[Sent]:
    """The acknowledged sends not read back at the queue offset they were given."""
    return [s for s in acked if read.get((s.queue_id, s.queue_offset)) != s.body]


@contextlib.contextmanager
def sigcont_on_exit(members: Sequence[Member]) -> Iterator[None]:
    """Resume every paused member however the block ends (a stopped process
    would outlive the test's kill otherwise: SIGKILL works, but the reaper
    would wait on nothing else)."""
    try:
        yield
    finally:
        for m in members:
            if m.paused:
                m.resume()


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.1
) -> float:
    """Poll ``check`` until true; seconds waited; AssertionError naming ``what``
    after ``timeout_s`` (the fault loop's own :func:`tests.support.polling.eventually`,
    which it cannot import). Exceptions of ``check`` count as false."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(Exception):
            if await check():
                return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not true within {timeout_s} s")
        await asyncio.sleep(interval_s)


# -- the fault loop --------------------------------------------------------------------

#: The faults the loop injects, one per cycle.
FAULTS = ("kill -9", "sigstop", "sigterm", "etcd restart")


@dataclass
class FaultReport:
    """What a :class:`FaultLoop` saw; :attr:`failures` empty means every check held."""

    cycles: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    #: Sends answered SEND_OK; sends tried (every attempt); attempts that failed.
    acked: int = 0
    attempts: int = 0
    failed_attempts: int = 0
    read_back: int = 0
    consumed: int = 0
    #: Acknowledged bodies not at their queue offset at the end.
    lost: list[str] = field(default_factory=list)
    #: Bodies read more than once at the end (a retried send that had been written).
    duplicates: int = 0
    #: A queue offset acknowledged (or consumed) with two different bodies.
    reissued: list[str] = field(default_factory=list)
    #: A queue that ends shorter than a consumer's position in it (it shrank).
    went_back: list[str] = field(default_factory=list)
    #: Reads that found the queue shorter than the consumer's position for a
    #: while (a member that has not dispatched as far yet: a slave the
    #: producers still took for the master, or a master just elected).
    behind_reads: int = 0
    #: Consumed messages whose queue offset holds another body (or none) at the end.
    vanished: list[str] = field(default_factory=list)
    #: Members whose CommitLog differs from the master's at the end.
    not_identical: list[int] = field(default_factory=list)
    #: Seconds from each fault to the next SEND_OK, by fault kind.
    unavailable_s: dict[str, list[float]] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def failures(self) -> list[str]:
        out = [f"lost {x}" for x in self.lost[:10]]
        out += [f"reissued {x}" for x in self.reissued[:10]]
        out += [f"went back {x}" for x in self.went_back[:10]]
        out += [f"vanished {x}" for x in self.vanished[:10]]
        out += [f"member {i}'s CommitLog differs" for i in self.not_identical]
        return out

    def figures(self) -> dict[str, object]:
        """The report as JSON-able figures."""
        return {
            "cycles": self.cycles,
            "faults": self.faults,
            "acked": self.acked,
            "attempts": self.attempts,
            "failed_attempts": self.failed_attempts,
            "read_back": self.read_back,
            "consumed": self.consumed,
            "lost": len(self.lost),
            "duplicates": self.duplicates,
            "reissued": len(self.reissued),
            "went_back": len(self.went_back),
            "behind_reads": self.behind_reads,
            "vanished": len(self.vanished),
            "not_identical": self.not_identical,
            "unavailable_s": {
                k: {"n": len(v), "min": min(v), "avg": sum(v) / len(v), "max": max(v)}
                for k, v in self.unavailable_s.items()
                if v
            },
            "elapsed_s": round(self.elapsed_s, 1),
        }

    def table(self) -> str:
        """The report as a printed table."""
        rows = [
            ("cycles", str(self.cycles)),
            *((f"faults: {k}", str(v)) for k, v in self.faults.items()),
            ("acked", str(self.acked)),
            ("send attempts (failed)", f"{self.attempts} ({self.failed_attempts})"),
            ("read back", str(self.read_back)),
            ("consumed", str(self.consumed)),
            ("lost", str(len(self.lost))),
            ("duplicates", str(self.duplicates)),
            ("queue offsets reissued", str(len(self.reissued))),
            ("queues gone back", str(len(self.went_back))),
            ("reads behind a consumer (transient)", str(self.behind_reads)),
            ("consumed then vanished", str(len(self.vanished))),
            ("CommitLogs differing", str(len(self.not_identical))),
        ]
        for kind, values in self.unavailable_s.items():
            if values:
                rows.append(
                    (
                        f"no SEND_OK after {kind} (s)",
                        f"min {min(values):.2f} avg {sum(values) / len(values):.2f} "
                        f"max {max(values):.2f}",
                    )
                )
        rows.append(("elapsed (s)", f"{self.elapsed_s:.1f}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


class FaultLoop:
    """A 3-member SYNC group (min_in_sync_replicas 2) on a private etcd under
    ``directory``; producers and a consumer run while every cycle injects one
    seeded random fault (kill -9, SIGSTOP then SIGCONT, or SIGTERM of a random
    member - the master half the time - or kill -9 and restart of etcd),
    repairs it, and waits for the group to be whole again. Then the history
    is checked (:class:`FaultReport`).

    Producers send each body until it is answered SEND_OK (to the member a
    NOT_MASTER names, else the next one), so a send written but answered
    late is sent again: read twice, a duplicate, never a loss."""

    def __init__(
        self,
        directory: Path,
        *,
        cycles: int,
        seed: int,
        producers: int = 2,
        fault_every_s: tuple[float, float] = (1.0, 2.5),
        heal_timeout_s: float = 60.0,
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.directory = directory
        self.cycles = cycles
        self.random = random.Random(seed)
        self.producers = producers
        self.fault_every_s = fault_every_s
        self.heal_timeout_s = heal_timeout_s
        self.log = log
        self.report = FaultReport()
        self.acked: list[Sent] = []
        self.seen: dict[tuple[int, int], bytes] = {}
        self.leader = 0
        #: The consumer's next offset in each queue.
        self.position = [0] * QUEUES
        self._stop = asyncio.Event()
        #: The latest start of a send answered SEND_OK, and when it was answered.
        self._last_ok = (0.0, 0.0)

    async def run(self) -> FaultReport:
        started = time.monotonic()
        etcd = EtcdProcess(self.directory / "etcd" / "data", unsafe_no_fsync=True)
        etcd.start()
        try:
            async with ReplicaGroup(
                self.directory, etcd.endpoint, "faults", flags=ha_flags(min_in_sync=2)
            ) as group:
                await wait_for(lambda: group.in_sync({0, 1, 2}), self.heal_timeout_s, "in sync")
                self.leader = (await group.state()).master_id
                tasks = [
                    asyncio.ensure_future(self._produce(group, p)) for p in range(self.producers)
                ]
                tasks.append(asyncio.ensure_future(self._consume(group)))
                try:
                    for cycle in range(self.cycles):
                        await asyncio.sleep(self.random.uniform(*self.fault_every_s))
                        await self._fault(group, etcd, cycle)
                        await wait_for(
                            lambda: group.in_sync({0, 1, 2}), self.heal_timeout_s, "healed"
                        )
                        self.report.cycles += 1
                finally:
                    self._stop.set()
                    await asyncio.gather(*tasks, return_exceptions=True)
                await self._check(group)
        finally:
            etcd.kill()
            self.report.elapsed_s = time.monotonic() - started
        return self.report

    # -- the faults -------------------------------------------------------------------

    async def _fault(self, group: ReplicaGroup, etcd: EtcdProcess, cycle: int) -> None:
        kind = self.random.choice(FAULTS)
        state = await group.state()
        # The master half the time: its faults are the ones that elect.
        slaves = [i for i in group.members if i != state.master_id]
        pick = state.master_id if self.random.random() < 0.5 else self.random.choice(slaves)
        target = group.members[pick]
        role = "master" if target.broker_id == state.master_id else "slave"
        what = "etcd" if kind == "etcd restart" else f"{role} {target.broker_id}"
        self.log(f"cycle {cycle + 1}/{self.cycles}: {kind} of {what} (epoch {state.epoch})")
        self.report.faults[kind] += 1
        injected = time.monotonic()
        if kind == "kill -9":
            target.kill()
            await asyncio.sleep(self.random.uniform(0.5, 2.0))
            await group.restart(target.broker_id)
        elif kind == "sigstop":
            with sigcont_on_exit([target]):
                target.pause()
                await asyncio.sleep(self.random.uniform(0.5, 4.0))
        elif kind == "sigterm":
            await asyncio.to_thread(target.terminate)
            await group.restart(target.broker_id)
        else:
            await asyncio.to_thread(etcd.kill)
            await asyncio.sleep(self.random.uniform(0.5, 2.0))
            await asyncio.to_thread(etcd.start)
        label = kind if kind == "etcd restart" else f"{kind} ({role})"
        await wait_for(lambda: self._ok_since(injected), self.heal_timeout_s, "a SEND_OK")
        self.report.unavailable_s.setdefault(label, []).append(self._last_ok[1] - injected)

    async def _ok_since(self, t: float) -> bool:
        """A send started after ``t`` was answered SEND_OK."""
        return self._last_ok[0] > t

    # -- the clients ------------------------------------------------------------------

    async def _produce(self, group: ReplicaGroup, producer: int) -> None:
        n = 0
        ids = sorted(group.members)
        while not self._stop.is_set():
            body = b"p%d-%d" % (producer, n)
            n += 1
            while not self._stop.is_set():
                target = self.leader
                self.report.attempts += 1
                sent_at = time.monotonic()
                s = await group.send(target, body, n % QUEUES, timeout_s=3.0)
                if s.ok:
                    self.acked.append(s)
                    self.report.acked += 1
                    self._last_ok = max(self._last_ok, (sent_at, time.monotonic()))
                    break
                self.report.failed_attempts += 1
                named = (
                    master_address_of(s.message) if s.code == pb.RESPONSE_CODE_NOT_MASTER else None
                )
                by_address = {m.address: i for i, m in group.members.items()}
                if named in by_address:
                    self.leader = by_address[named]
                elif self.leader == target:
                    self.leader = ids[(ids.index(target) + 1) % len(ids)]
                await asyncio.sleep(0.02)

    async def _consume(self, group: ReplicaGroup) -> None:
        """Read every queue from the member the producers use, in order; record
        what was read and any position the queue no longer reaches."""
        position = self.position = [0] * QUEUES
        while not self._stop.is_set():
            member = self.leader
            for q in range(QUEUES):
                try:
                    r = await group.stub(member).GetMessage(
                        sn.GetMessageRequest(
                            group="loop", topic=TOPIC, queue_id=q, offset=position[q],
                            max_msg_nums=64,
                        ),
                        timeout=3,
                    )  # fmt: skip
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
                    continue
                if r.status == pb.GET_MESSAGE_STATUS_OFFSET_OVERFLOW_BADLY:
                    self.report.behind_reads += 1  # final: _check compares the end
                    continue
                if r.status != pb.GET_MESSAGE_STATUS_FOUND:
                    continue
                for raw in split_records(r.records.data):
                    record = decode_record(raw)
                    key = (q, record.queue_offset)
                    if self.seen.setdefault(key, record.body) != record.body:
                        self.report.reissued.append(f"{key} consumed as two bodies")
                    self.report.consumed += 1
                position[q] = r.next_begin_offset
            await asyncio.sleep(0.05)

    # -- the checks -------------------------------------------------------------------

    async def _check(self, group: ReplicaGroup) -> None:
        master = (await group.state()).master_id
        read: dict[tuple[int, int], bytes] = {}

        async def read_back() -> bool:
            read.update(await group.read_all(master))
            return True

        await wait_for(read_back, self.heal_timeout_s, "the final read")
        self.report.read_back = len(read)
        holder: dict[tuple[int, int], bytes] = {}
        for s in self.acked:
            key = (s.queue_id, s.queue_offset)
            if holder.setdefault(key, s.body) != s.body:
                self.report.reissued.append(f"{key} acknowledged for two bodies")
        self.report.lost = [
            f"{s.body.decode()} at {(s.queue_id, s.queue_offset)}"
            for s in missing(self.acked, read)
        ]
        for q in range(QUEUES):
            length = sum(1 for qq, _ in read if qq == q)
            if length < self.position[q]:
                self.report.went_back.append(
                    f"queue {q} ends at {length}, consumed to {self.position[q]}"
                )
        self.report.vanished = [
            f"{key}: {body.decode()}" for key, body in self.seen.items() if read.get(key) != body
        ]
        counts: dict[bytes, int] = {}
        for body in read.values():
            counts[body] = counts.get(body, 0) + 1
        self.report.duplicates = sum(c - 1 for c in counts.values())

        async def identical() -> bool:
            logs = {i: commitlog_bytes(m.commitlog()) for i, m in group.members.items()}
            self.report.not_identical = [i for i in logs if logs[i] != logs[master]]
            return not self.report.not_identical

        with contextlib.suppress(AssertionError):
            await wait_for(identical, self.heal_timeout_s, "byte-identical CommitLogs")

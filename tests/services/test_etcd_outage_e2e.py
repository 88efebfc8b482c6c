"""etcd away for 10 s under load, as real processes: sends and pulls continue;
registrations return when etcd does.

2 store-nodes and 1 pull-service run as processes on a private etcd, which
goes away for longer than the lease TTL in one of two ways:

* stopped: SIGTERM (the process exits), then started again on the same ports
  and data dir. Clients are refused at once; etcd renews every lease when it
  starts, so the old leases may live on if their keepalives resume;
* frozen: SIGSTOP, then SIGCONT (a stalled etcd: a long GC pause, a stuck
  disk). Calls hang rather than fail, and on waking etcd finds every lease
  past its TTL: it deletes every registration, which must come back under a
  new lease while the load runs.

Throughout, one coroutine sends batches through the raw StoreNode stubs to
every queue of both store-nodes, another pulls every queue through the
pull-service (committing as it goes), and a consumer keeps a Session there.
During and after the outage both keep working without one failure; once etcd
is back, every registration (both brokers, the pull-service, the consumer) is
in etcd again and still there two lease TTLs later (so only keepalives that
resumed keep them; after a freeze, each under a new lease); every
acknowledged message was pulled exactly once, in order, per queue.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually
from tests.support.processes import (
    BROKERS,
    QUEUES,
    TOPIC,
    ServiceProcess,
    consume,
    create_topic,
    registered,
    start_processes,
)
from tests.support.rpc import bodies, pull_request
from tests.support.sessions import Consumer
from tests.support.timeouts import ASYNC_TEST_TIMEOUT_S

pytestmark = pytest.mark.slow

#: How long etcd stays away: longer than the lease TTL.
OUTAGE_S = 10.0
LEASE_TTL_S = 3
GROUP = "G"
CLIENT_ID = "10.2.2.2@9"
#: Messages per SendBatch, and the pause after each round over the queues.
BATCH = 8
SEND_PAUSE_S = 0.005
#: Deadline of one send or pull: far above a healthy call, so a hang is a failure.
CALL_TIMEOUT_S = 10.0
#: Bound on any wait for something to happen (a poll, never an assertion on time).
WAIT_S = 20.0

Queue = tuple[str, int]
QUEUE_IDS: list[Queue] = [(b, q) for b in BROKERS for q in range(QUEUES)]


@dataclass
class Load:
    """What the load saw; times are ``time.monotonic()``."""

    #: Acknowledged bodies per queue, in queue-offset order.
    sent: dict[Queue, list[bytes]] = field(default_factory=lambda: {k: [] for k in QUEUE_IDS})
    #: Bodies the puller received per queue, in the order received.
    received: dict[Queue, list[bytes]] = field(default_factory=lambda: {k: [] for k in QUEUE_IDS})
    #: (started, answered) of every acknowledged send and of every pull that found records.
    sends: list[tuple[float, float]] = field(default_factory=list)
    pulls: list[tuple[float, float]] = field(default_factory=list)
    #: (started, failed, what) of every send or pull that did not succeed.
    failures: list[tuple[float, float, str]] = field(default_factory=list)
    #: Set to stop sending; the puller then drains every queue and returns.
    stop_sending: asyncio.Event = field(default_factory=asyncio.Event)

    def caught_up(self, offsets: dict[Queue, int]) -> bool:
        return all(offsets[k] >= len(self.sent[k]) for k in QUEUE_IDS)


@dataclass(frozen=True)
class Outage:
    """A way for etcd to go away and come back; both block until done."""

    name: str
    begin: Callable[[EtcdProcess], None]
    end: Callable[[EtcdProcess], None]
    #: etcd expires every lease on its return: each registration is put again.
    leases_expire: bool


def _stop(etcd: EtcdProcess) -> None:
    etcd.stop()  # returns once the process has exited


def _start(etcd: EtcdProcess) -> None:
    etcd.start()  # same ports, same data dir


def _freeze(etcd: EtcdProcess) -> None:
    assert etcd.pid is not None, "etcd is not running"
    os.kill(etcd.pid, signal.SIGSTOP)


def _thaw(etcd: EtcdProcess) -> None:
    assert etcd.pid is not None, "etcd is not running"
    os.kill(etcd.pid, signal.SIGCONT)
    etcd.wait_healthy()


STOPPED = Outage("stopped", _stop, _start, leases_expire=False)
FROZEN = Outage("frozen", _freeze, _thaw, leases_expire=True)


def leases(etcd: EtcdProcess, cluster: str) -> dict[str, int]:
    """The lease of every leased key of ``cluster`` (its registrations)."""
    out = etcd.etcdctl("get", "--prefix", f"/basalt/{cluster}/", "-w", "json")
    return {
        base64.b64decode(kv["key"]).decode(): kv["lease"]
        for kv in json.loads(out).get("kvs", [])
        if kv.get("lease")
    }


def inside(calls: list[tuple[float, float]], window: tuple[float, float]) -> int:
    """How many calls started and ended within ``window``."""
    return sum(1 for started, ended in calls if window[0] <= started and ended <= window[1])


async def send_continuously(stubs: dict[str, sn_grpc.StoreNodeAsyncStub], load: Load) -> None:
    """Batches to every queue of both store-nodes, round robin, until told to stop."""
    while not load.stop_sending.is_set():
        for broker, q in QUEUE_IDS:
            sent = load.sent[(broker, q)]
            batch = [f"{broker}/{q}/{len(sent) + i}".encode() for i in range(BATCH)]
            request = sn.SendBatchRequest(
                topic=TOPIC,
                queue_id=q,
                messages=pb.MessageList(messages=[pb.Message(body=b) for b in batch]),
            )
            started = time.monotonic()
            try:
                r = await stubs[broker].SendBatch(request, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                load.failures.append((started, time.monotonic(), f"send {broker}/{q}: {e}"))
                continue
            offsets = list(range(len(sent), len(sent) + BATCH))  # one sender: no gaps
            if r.result.status != pb.SEND_STATUS_SEND_OK or r.result.queue_offsets != offsets:
                load.failures.append((started, time.monotonic(), f"send {broker}/{q}: {r}"))
                continue
            sent.extend(batch)
            load.sends.append((started, time.monotonic()))
        await asyncio.sleep(SEND_PAUSE_S)


async def pull_continuously(stub: ps_grpc.PullServiceAsyncStub, load: Load) -> None:
    """Pull (and commit) every queue through the pull-service, round robin, until
    the sender has stopped and every acknowledged message has been pulled."""
    offsets = dict.fromkeys(QUEUE_IDS, 0)
    while not (load.stop_sending.is_set() and load.caught_up(offsets)):
        for broker, q in QUEUE_IDS:
            offset = offsets[(broker, q)]
            request = pull_request(
                broker,
                q,
                offset,
                topic=TOPIC,
                group=GROUP,
                max_nums=256,
                commit_offset=offset,
                suspend_timeout_ms=100,  # long polling, briefly: the other queues wait
            )
            started = time.monotonic()
            try:
                r = await stub.Pull(request, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as e:
                load.failures.append((started, time.monotonic(), f"pull {broker}/{q}: {e}"))
                await asyncio.sleep(0.01)  # no busy loop against a refusing service
                continue
            if r.status == pb.PULL_STATUS_FOUND:
                load.received[(broker, q)] += bodies(r)
                offsets[(broker, q)] = r.next_begin_offset
                load.pulls.append((started, time.monotonic()))
            elif r.status != pb.PULL_STATUS_NO_NEW_MSG:
                load.failures.append((started, time.monotonic(), f"pull {broker}/{q}: {r}"))


async def load_through_outage(
    etcd: EtcdProcess,
    outage: Outage,
    stub: ps_grpc.PullServiceAsyncStub,
    node_stubs: dict[str, sn_grpc.StoreNodeAsyncStub],
    all_registered: Callable[[], Awaitable[bool]],
) -> tuple[Load, tuple[float, float]]:
    """Run the load, take etcd away by ``outage`` for OUTAGE_S, bring it back, wait
    for every registration, keep the load on for two lease TTLs more, then stop
    sending and let the puller drain. Returns what the load saw and the outage's
    window."""
    load = Load()
    tasks = [
        asyncio.ensure_future(send_continuously(node_stubs, load)),
        asyncio.ensure_future(pull_continuously(stub, load)),
    ]

    async def warmed_up() -> bool:
        return bool(load.sends and load.pulls)

    try:
        await eventually(
            warmed_up, timeout_s=WAIT_S, interval_s=0.1, what="sends and pulls before the outage"
        )
        await asyncio.to_thread(outage.begin, etcd)
        away = time.monotonic()
        try:
            await asyncio.sleep(OUTAGE_S)
        finally:
            window = (away, time.monotonic())
            await asyncio.to_thread(outage.end, etcd)
        back = time.monotonic()
        await eventually(
            all_registered,
            timeout_s=WAIT_S,
            interval_s=0.1,
            what="every registration after etcd is back",
        )
        # The keys above may still be the old ones (renewed by a restarted etcd, or
        # not yet expired by a thawed one): keep going for two TTLs, after which
        # only kept-alive leases remain.
        while time.monotonic() < back + 2 * LEASE_TTL_S:
            await asyncio.sleep(0.1)
    finally:
        load.stop_sending.set()
        # The puller returns once it has pulled everything acknowledged.
        _, late = await asyncio.wait(tasks, timeout=WAIT_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    assert not late, "the puller did not catch up with the acknowledged sends"
    for task in tasks:
        task.result()  # a load coroutine's own error, if it had one
    return load, window


@pytest.mark.parametrize("outage", [STOPPED, FROZEN], ids=lambda o: o.name)
def test_etcd_away_under_load_sends_and_pulls_continue_registrations_return(
    tmp_path: Path, private_etcd: EtcdProcess, processes: list[ServiceProcess], outage: Outage
) -> None:
    etcd, cluster = private_etcd, unique_cluster()
    asyncio.run(create_topic(etcd, cluster))
    nodes, pull = start_processes(tmp_path, etcd, cluster, LEASE_TTL_S, processes)
    everyone = ({*BROKERS}, {"ps-1"}, {CLIENT_ID})

    async def all_registered() -> bool:
        return await registered(etcd, cluster) == everyone

    async def scenario() -> None:
        async with (
            grpc.aio.insecure_channel(pull.address) as channel,
            grpc.aio.insecure_channel(nodes[BROKERS[0]].address) as channel_a,
            grpc.aio.insecure_channel(nodes[BROKERS[1]].address) as channel_b,
        ):
            stub = ps_grpc.PullServiceStub(channel)
            node_stubs = {
                BROKERS[0]: sn_grpc.StoreNodeStub(channel_a),
                BROKERS[1]: sn_grpc.StoreNodeStub(channel_b),
            }

            async def routed() -> bool:  # the store-nodes register in the background
                route = (await stub.QueryRoute(ps.QueryRouteRequest(topic=TOPIC))).route
                return len(route.broker_datas) == len(BROKERS)

            await eventually(
                routed,
                timeout_s=WAIT_S,
                interval_s=0.1,
                what="both store-nodes in the pull-service's route",
            )
            consumer = Consumer(stub, CLIENT_ID, group=GROUP)
            await consumer.open()
            await eventually(
                all_registered,
                timeout_s=WAIT_S,
                interval_s=0.1,
                what="every registration before the outage",
            )
            leased = await asyncio.to_thread(leases, etcd, cluster)
            # Each store-node: its group member key and its route, on one lease;
            # and the pull-service, the consumer.
            assert len(leased) == 2 * len(BROKERS) + 2, leased

            try:
                load, window = await load_through_outage(
                    etcd, outage, stub, node_stubs, all_registered
                )
                assert load.failures == [], [
                    (round(started - window[0], 2), round(failed - window[0], 2), what)
                    for started, failed, what in load.failures
                ]
                assert inside(load.sends, window) > 0
                assert inside(load.pulls, window) > 0
                assert not consumer.ended.done()  # the session lived through the outage
                # Every acknowledged message pulled exactly once, in queue order, by
                # the committing puller and by a fresh group reading from the start.
                assert load.received == load.sent
                assert await consume(stub, "GAll") == load.sent
                assert await all_registered()  # still there, two TTLs after etcd's return
                if outage.leases_expire:  # ... each put again under a new lease
                    now = await asyncio.to_thread(leases, etcd, cluster)
                    assert now.keys() == leased.keys()
                    assert all(now[k] != leased[k] for k in now), (leased, now)
            finally:
                await consumer.cancel()

    try:
        asyncio.run(asyncio.wait_for(scenario(), ASYNC_TEST_TIMEOUT_S))
    finally:
        if etcd.pid is not None:  # never leave a frozen etcd behind (SIGCONT is harmless)
            os.kill(etcd.pid, signal.SIGCONT)
    assert pull.stop() == 0
    for p in nodes.values():
        assert p.stop() == 0
    for p in (*nodes.values(), pull):  # nothing went wrong on the way
        log = p.log.read_text()
        assert "Traceback" not in log and " ERROR " not in log, log

"""``basalt admin resetOffsetByTime`` (RocketMQ's ResetOffsetByTimeCommand) run as a
user would, against real etcd, store-nodes, a pull-service and a live consumer
session."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from pathlib import Path

from basalt.services.meta import MetaConfig
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.processes import run_basalt as basalt
from tests.support.sessions import Consumer
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S


async def search_offsets(h, t_ms: int) -> dict[tuple[str, int], int]:  # type: ignore[no-untyped-def]
    out = {}
    for broker, stub in h.node_stubs.items():
        for q in range(4):
            got = await stub.SearchOffset(
                sn.SearchOffsetRequest(topic=TOPIC, queue_id=q, timestamp_ms=t_ms)
            )
            out[broker, q] = got.offset
    return out


def table(out: str) -> dict[tuple[str, int], int]:
    return {(r["broker"], r["queue"]): r["offset"] for r in json.loads(out) if r["queue"] != ""}


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_reset_by_time_offline_live_forced_formats_and_a_failed_store_node(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster, "--json")
        ep = ("--endpoints", h.services[0].address)
        assert (await basalt("produce", *ep, "-t", TOPIC, "-n", "16", "--size", "4"))[0] == 0
        await asyncio.sleep(0.05)
        t_mid = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        assert (await basalt("produce", *ep, "-t", TOPIC, "-n", "16", "--size", "4"))[0] == 0
        code, out, _ = await basalt("consume", *ep, "-t", TOPIC, "-g", "G", "--idle-ms", "300")
        assert "received 32 messages" in out

        # Offline group (no session): reset on the store-nodes only.
        code, out, err = await basalt(
            "admin", "resetOffsetByTime", "-g", "G", "-t", TOPIC, "-s", str(t_mid), *etcd
        )
        assert code == 0, err
        assert "no live consumer" in out
        reset = table(out)
        assert reset == await search_offsets(h, t_mid)
        maxes = {
            (b, q): (
                await stub.GetMinMaxOffset(sn.GetMinMaxOffsetRequest(topic=TOPIC, queue_id=q))
            ).max_offset
            for b, stub in h.node_stubs.items()
            for q in range(4)
        }
        # RocketMQ's offset by time is the nearest message's: the 16 sent after
        # t_mid, plus the last one before it where that one is nearer.
        again = sum(maxes[q] - reset[q] for q in maxes)
        assert 16 <= again <= 24
        code, out, _ = await basalt("consume", *ep, "-t", TOPIC, "-g", "G", "--idle-ms", "300")
        assert f"received {again} messages" in out  # from exactly the reset points

        # The date format gives the same table as the millis it names.
        local = datetime.datetime.fromtimestamp(t_mid / 1000)
        date = local.strftime("%Y-%m-%d#%H:%M:%S:") + f"{t_mid % 1000:03d}"
        code, out, _ = await basalt(
            "admin", "resetOffsetByTime", "-g", "G", "-t", TOPIC, "-s", date, *etcd
        )
        assert table(out) == await search_offsets(h, t_mid)
        # Not forced, to now: every queue keeps its earlier offset.
        code, out, _ = await basalt(
            "admin", "resetOffsetByTime", "-g", "G", "-t", TOPIC, "-s", "now", "-f", "false", *etcd
        )
        assert table(out) == await search_offsets(h, t_mid)
        # Forced, to now: the nearest message to now in every queue (its last).
        ends = await search_offsets(h, int(time.time() * 1000) + 60_000)
        code, out, _ = await basalt(
            "admin", "resetOffsetByTime", "-g", "G", "-t", TOPIC, "-s", "now", *etcd
        )
        ends = await search_offsets(h, int(time.time() * 1000) + 60_000)
        assert table(out) == ends

        # A live consumer gets the command and confirms it.
        consumer = Consumer(h.stub, "c1", group="G")
        await consumer.open()
        code, out, err = await basalt(
            "admin", "resetOffsetByTime", "-g", "G", "-t", TOPIC, "-s", str(t_mid), *etcd
        )
        assert code == 0, err
        rows = json.loads(out)
        assert {
            "broker": "consumer c1",
            "queue": "",
            "offset": "",
            "reset_epoch": "",
            "result": "OK",
        } in rows
        (command,) = consumer.commands
        assert command.WhichOneof("body") == "reset_offset"
        sent = {
            (o.queue.broker_name, o.queue.queue_id): o.offset for o in command.reset_offset.offsets
        }
        assert sent == table(out) == await search_offsets(h, t_mid)
        await consumer.close()

        # A store-node down: named, exit 1; the other one is reset.
        await h.nodes["broker-b"].stop(grace_s=0.5)
        code, out, err = await basalt(
            "admin",
            "resetOffsetByTime",
            "-g",
            "G",
            "-t",
            TOPIC,
            "-s",
            "now",
            "--timeout-ms",
            "500",
            *etcd,
        )
        assert code == 1
        rows = json.loads(out)
        assert any(r["broker"] == "broker-b" and r["result"].startswith("FAILED") for r in rows)
        assert {r["broker"] for r in rows if r["result"] == "reset"} == {"broker-a"}

        code, _, err = await basalt(
            "admin", "resetOffsetByTime", "-g", "G", "-t", TOPIC, "-s", "yesterday", *etcd
        )
        assert code == 1 and "yyyy-MM-dd#HH:mm:ss:SSS" in err

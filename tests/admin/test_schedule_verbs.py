"""``basalt admin scheduleStatus`` and the delivery time ``queryMsgById`` shows, run
as a user would (``python -m basalt.admin`` processes) against real etcd and
store-nodes holding delayed and timer messages that stay pending (levels of an
hour and more, timers hours ahead)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from basalt.services.meta import MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.nodes import BROKERS, TOPIC, Harness, cluster
from tests.support.processes import run_basalt as basalt
from tests.support.rpc import wire
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S

OTHER = "Reminders"
HOUR_MS = 3_600_000


async def _send(h: Harness, broker: str, message: pb.Message) -> pb.SendResult:
    reply = await h.node_stubs[broker].SendMessage(
        sn.SendMessageRequest(message=message, queue_id=0)
    )
    assert reply.result.status == pb.SEND_STATUS_SEND_OK
    return reply.result


def _rows(out: str, **match: Any) -> list[dict[str, Any]]:
    return [r for r in json.loads(out) if all(r[k] == v for k, v in match.items())]


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_schedule_status_lists_levels_and_timers_per_store_node(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        await h.create_topic(
            TopicConfig(topic_name=OTHER, read_queue_nums=1, write_queue_nums=1, brokers=BROKERS)
        )
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster)
        # Whole seconds: on any wheel tick, so each due time is listed as asked.
        hour = (int(time.time()) + 3600) * 1000
        delayed = await _send(h, "broker-a", wire(TOPIC, b"d", delay_level=18))
        dues = [hour + HOUR_MS, hour, hour + 2 * HOUR_MS]
        for due in dues:
            await _send(h, "broker-a", wire(TOPIC, b"t", deliver_time_ms=due))
        await _send(h, "broker-b", wire(OTHER, b"r", deliver_time_ms=hour + 5000))

        async def status(*flags: str) -> str:
            code, out, err = await basalt("admin", "scheduleStatus", *flags, *etcd)
            assert code == 0, err
            return out

        async def counted() -> str | None:
            # The timers count a message once they have read it from the log.
            out = await status("--json", "--next", "2")
            totals = _rows(out, name="(all topics)")
            return out if sum(r["pending"] for r in totals) == 4 else None

        out = await _eventually(counted)
        levels_a = _rows(out, broker="broker-a", kind="level")
        assert [r["name"] for r in levels_a] == [str(n) for n in range(1, 19)]
        assert levels_a[0]["delay"] == "1s" and levels_a[17]["delay"] == "2h"
        (level_18,) = [r for r in levels_a if r["pending"]]
        assert level_18["name"] == "18"
        assert level_18["next_due_ms"] == [delayed.store_timestamp_ms + 2 * HOUR_MS]
        assert all(r["pending"] == 0 for r in _rows(out, broker="broker-b", kind="level"))
        (timers_a,) = _rows(out, broker="broker-a", kind="timer", name=TOPIC)
        assert timers_a["pending"] == 3 and timers_a["next_due_ms"] == sorted(dues)[:2]
        (timers_b,) = _rows(out, broker="broker-b", kind="timer", name=OTHER)
        assert timers_b["pending"] == 1 and timers_b["next_due_ms"] == [hour + 5000]
        (all_a,) = _rows(out, broker="broker-a", name="(all topics)")
        assert all_a["pending"] == 3 and all_a["next_due_ms"] == [hour]
        assert 0 < all_a["read_to_ms"] < hour

        # One topic: its timers only, no delay levels; one store-node.
        out = await status("--json", "-t", OTHER, "-b", "broker-b")
        assert {(r["broker"], r["kind"], r["name"]) for r in json.loads(out)} == {
            ("broker-b", "timer", OTHER),
            ("broker-b", "timer", "(all topics)"),
        }
        # The table: dates, not milliseconds.
        out = await status("-b", "broker-a")
        header, _, *lines = out.splitlines()
        columns = ["broker", "kind", "name", "delay", "pending", "next_due", "read_to"]
        assert header.split() == columns
        assert any(line.split()[:5] == ["broker-a", "level", "18", "2h", "1"] for line in lines)
        assert not any("next_due_ms" in line for line in lines)

        code, _, err = await basalt("admin", "scheduleStatus", "-b", "broker-z", *etcd)
        assert code == 1 and "broker-z" in err
        code, _, err = await basalt("admin", "scheduleStatus", "--next", "-1", *etcd)
        assert code == 1 and "--next" in err
        # A store-node that refuses is a row of its own; exit 1.
        code, out, _ = await basalt("admin", "scheduleStatus", "--next", "5000", "--json", *etcd)
        assert code == 1
        failed = json.loads(out)
        assert {r["broker"] for r in failed} == set(BROKERS)
        assert all("(failed: " in r["kind"] and "max_next_due" in r["kind"] for r in failed)


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_query_msg_by_id_shows_the_delivery_time(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster, "--json")
        due = (int(time.time()) + 7200) * 1000
        delayed = await _send(h, "broker-a", wire(TOPIC, b"d", delay_level=17))
        timer = await _send(h, "broker-b", wire(TOPIC, b"t", deliver_time_ms=due))
        relative = await _send(
            h, "broker-a", wire(TOPIC, b"s", properties={"TIMER_DELAY_SEC": "5400"})
        )
        plain = await _send(h, "broker-a", wire(TOPIC, b"p"))
        # A time already past: stored in its topic at once, its time kept.
        past = (int(time.time()) - 60) * 1000
        at_once = await _send(h, "broker-b", wire(TOPIC, b"n", deliver_time_ms=past))

        async def shown(result: pb.SendResult) -> dict[str, Any]:
            code, out, err = await basalt(
                "admin", "queryMsgById", "-i", result.offset_msg_ids[0], *etcd
            )
            assert code == 0, err
            (row,) = json.loads(out)
            return row  # type: ignore[no-any-return]

        row = await shown(delayed)
        assert row["deliver_ms"] == delayed.store_timestamp_ms + HOUR_MS  # level 17: 1h
        assert row["deliver_time"].endswith("Z")
        assert (await shown(timer))["deliver_ms"] == due
        # Resolved when stored (on the store's clock as it parks it, which the
        # store time may differ from by the put's own duration): 90 minutes on.
        resolved = (await shown(relative))["deliver_ms"] - relative.store_timestamp_ms
        assert abs(resolved - 5_400_000) < 60_000
        row = await shown(at_once)
        assert row["deliver_ms"] == past and row["store_ms"] > past
        row = await shown(plain)
        assert row["deliver_ms"] is None and row["deliver_time"] == ""


async def _eventually(check: Any) -> str:
    """``check()``'s first answer that is not None, polling (the timer store's
    count follows the CommitLog by a moment)."""
    from tests.support.polling import eventually

    found: list[str] = []

    async def ready() -> bool:
        value = await check()
        if value is not None:
            found.append(value)
        return value is not None

    await eventually(ready, timeout_s=30, what="the timers counted")
    return found[0]

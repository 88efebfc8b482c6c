"""``basalt admin <verb> --server``: the verbs the admin service offers, run as a
user would (``python -m basalt.admin`` processes) through a real admin service, and
compared with the same verbs run over etcd directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from basalt.admin.cli import main
from basalt.services.cluster.etcd import free_port
from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from tests.support.aio import async_test
from tests.support.nodes import BROKERS, TOPIC, admin_server, cluster
from tests.support.processes import run_basalt as basalt
from tests.support.sessions import Consumer
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S

BOTH = ",".join(BROKERS)


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_topic_verbs_through_the_service_print_what_the_direct_run_prints(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, topic=None), admin_server(meta_config) as server:
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster)
        via = ("--server", server)

        code, out, err = await basalt("admin", "updateTopic", "-t", "Orders", "-r", "4", *via)
        assert code == 0, err
        assert out.splitlines()[2].split() == [
            "Orders",
            "4",
            "8",
            "6",
            "broker-a,broker-b",
            "created",
        ]
        # Only the fields given change (GetTopic, then UpdateTopic at its revision).
        code, out, err = await basalt("admin", "updateTopic", "-t", "Orders", "-w", "2", *via)
        assert code == 0, err
        assert out.splitlines()[2].split() == [
            "Orders",
            "4",
            "2",
            "6",
            "broker-a,broker-b",
            "updated",
        ]
        code, out, _ = await basalt("admin", "updateTopic", "-t", "Audit", "-b", "broker-a", *via)
        assert "broker-a " in out and "created" in out

        direct = await basalt("admin", "topicList", *etcd)
        served = await basalt("admin", "topicList", *via)
        assert served == direct and direct[1].splitlines()[2:] == ["Audit", "Orders"]
        direct = await basalt("admin", "topicList", "--json", *etcd)
        assert await basalt("admin", "topicList", "--json", *via) == direct

        # Refusals: the service's message, the direct run's exit status.
        for argv, says in (
            (("deleteTopic", "-t", "Nope"), "topic 'Nope' does not exist"),
            (
                ("updateTopic", "-t", "X", "-b", "broker-z"),
                "no registered store-node named broker-z",
            ),
            (("updateTopic", "-t", "Orders", "-r", "0"), "read_queue_nums must be 1..1024, got 0"),
            (("deleteTopic", "-t", "no such"), "topic 'no such' is not 1-127 characters"),
        ):
            direct = await basalt("admin", *argv, *etcd)
            served = await basalt("admin", *argv, *via)
            assert served[0] == direct[0] == 1 and says in served[2], served
            if argv[0] != "deleteTopic" or argv[2] == "Nope":  # the direct run checks no name
                assert served == direct
        code, out, _ = await basalt("admin", "deleteTopic", "-t", "Audit", *via)
        assert code == 0 and "deleted" in out
        assert (await basalt("admin", "topicList", *etcd))[1].splitlines()[2:] == ["Orders"]


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_reset_offset_by_time_through_the_service(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h, admin_server(meta_config) as server:
        via = ("--server", server, "--json")
        for q in range(4):
            await h.send("broker-a", q, b"x")
        reset = ("resetOffsetByTime", "-g", "G", "-t", TOPIC, "-s", "-1")

        code, out, err = await basalt("admin", *reset, *via)
        assert code == 0, err
        rows = json.loads(out)
        offsets = {(r["broker"], r["queue"]): r["offset"] for r in rows if r["queue"] != ""}
        assert offsets == {
            (b, q): int(b == "broker-a") for b in ("broker-a", "broker-b") for q in range(4)
        }
        assert rows[-1]["result"] == "no live consumer: reset on the store-nodes only"

        consumer = Consumer(h.stub, "c1", group="G")
        await consumer.open(pb.TopicSubscription(topic=TOPIC))
        code, out, err = await basalt("admin", *reset, "--timeout-ms", "2000", *via)
        assert code == 0, err
        assert json.loads(out)[-1] == {
            "broker": "consumer c1",
            "queue": "",
            "offset": "",
            "reset_epoch": "",
            "result": "OK",
        }
        assert consumer.commands[0].timeout_ms == 2000  # --timeout-ms went through

        await h.nodes["broker-b"].stop(grace_s=0.5)
        code, out, err = await basalt("admin", *reset, *via)
        assert (code, out) == (1, "")
        assert "store-node 'broker-b': UNAVAILABLE" in err and "Reset done on broker-a" in err
        await consumer.close()


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_an_admin_service_that_does_not_answer_is_named() -> None:
    address = f"127.0.0.1:{free_port()}"
    code, out, err = await basalt("admin", "topicList", "--server", address)
    assert (code, out) == (1, "")
    assert f"basalt admin topicList: admin service at {address}: UNAVAILABLE" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["topicRoute", "-t", "T", "--server", "h:1"], "unrecognized arguments: --server"),
        (["topicList", "--server", "h:1", "--etcd", "h:2"], "not allowed with argument"),
        (["topicList", "--server"], "no --server address, and no local cluster in ./.basalt"),
    ],
)
def test_server_usage_errors_exit_2(
    argv: list[str],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./.basalt here: no local cluster
    assert main(["admin", *argv]) == 2
    assert says in capsys.readouterr().err

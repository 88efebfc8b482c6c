"""``basalt cluster up | status | down`` as an operator runs it: real processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import grpc
import pytest

from basalt.common.record import decode_record, split_records
from basalt.services.process import SERVICE_ENV
from basalt.v1 import admin_pb2 as adm
from basalt.v1 import admin_pb2_grpc as adm_grpc
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.polling import eventually
from tests.support.processes import run_basalt_sync

pytestmark = pytest.mark.slow


def basalt(*args: str) -> subprocess.CompletedProcess[str]:
    """``basalt cluster ARGS...``."""
    return run_basalt_sync("cluster", *args)


def test_up_serves_a_send_and_a_pull_then_down_stops_everything(tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    started = basalt("up", "--data-dir", str(data))
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert all(r in started.stdout for r in ("store-node", "pull-service", "admin"))
        procs = json.loads((data / "cluster.json").read_text())
        assert [p["role"] for p in procs] == [
            "etcd",
            "store-node",
            "store-node",
            "pull-service",
            "admin",
        ]
        # Each service runs with the launcher's gRPC settings (the caller's own win).
        for p in procs[1:]:
            environ = Path(f"/proc/{p['pid']}/environ").read_bytes().split(b"\0")
            for name, default in SERVICE_ENV.items():
                wanted = os.environ.get(name, default)
                assert f"{name}={wanted}".encode() in environ, (p["name"], name)
        status = basalt("status", "--data-dir", str(data))
        assert status.returncode == 0, status.stdout
        # Each store-node a group of one, its master; the pull-service registered.
        assert status.stdout.count(" MASTER ") == 2
        assert status.stdout.count("registered") == 1
        (admin_line,) = [line for line in status.stdout.splitlines() if line.startswith("admin")]
        assert "alive" in admin_line and "SERVING" in admin_line
        broker = next(p for p in procs if p["name"] == "broker-a")
        pull_service = next(p for p in procs if p["role"] == "pull-service")
        bodies = asyncio.run(send_and_pull(broker["address"], pull_service["address"]))
        assert bodies == [b"hello cluster"]
        # Laptop-sized files, said at start: a 64 MiB CommitLog file, a ~4 MB IndexFile.
        assert "laptop-sized files" in started.stdout and "RocketMQ's" in started.stdout
        (commitlog,) = (data / "broker-a" / "commitlog").iterdir()
        assert commitlog.stat().st_size == 64 << 20
        # (The IndexFile appears once the dispatcher has indexed the send.)
        assert all(f.stat().st_size < 5 << 20 for f in data.glob("broker-a/index/*"))
        assert "max_index_num=200000" in (data / "store-node.conf").read_text()
        # The admin service answers, over the cluster's etcd: the topic the send created.
        admin = next(p for p in procs if p["role"] == "admin")
        assert asyncio.run(topic_list(admin["address"])) == ["Hello"]
        listed = run_basalt_sync("admin", "topicList", "--server", admin["address"])
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[2:] == ["Hello"]
        again = basalt("up", "--data-dir", str(data))
        assert again.returncode == 2  # one cluster per data dir
    finally:
        stopped = basalt("down", "--data-dir", str(data))
    assert stopped.returncode == 0, stopped.stdout
    for p in procs:
        with pytest.raises(ProcessLookupError):
            os.kill(p["pid"], 0)
    assert not (data / "broker-a" / "abort").exists()  # stopped cleanly


async def topic_list(admin: str) -> list[str]:
    async with grpc.aio.insecure_channel(admin) as channel:
        listed = await adm_grpc.AdminStub(channel).TopicList(adm.TopicListRequest())
    return list(listed.topics)


async def send_and_pull(broker: str, pull_service: str) -> list[bytes]:
    async with grpc.aio.insecure_channel(broker) as channel:
        sent = await sn_grpc.StoreNodeStub(channel).SendMessage(
            sn.SendMessageRequest(message=pb.Message(topic="Hello", body=b"hello cluster"))
        )
        assert sent.result.status == pb.SEND_STATUS_SEND_OK
    async with grpc.aio.insecure_channel(pull_service) as channel:
        stub = ps_grpc.PullServiceStub(channel)
        pulled = pb.PullResponse()

        async def topic_known() -> bool:  # the topic reaches the pull-service's etcd cache
            nonlocal pulled
            try:
                pulled = await stub.Pull(
                    ps.PullRequest(
                        group="G",
                        queue=pb.MessageQueue(topic="Hello", broker_name="broker-a", queue_id=0),
                        max_nums=32,
                    )
                )
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return False
            return True

        await eventually(topic_known, interval_s=0.05, what="the topic reaching the pull-service")
        return [decode_record(r).body for r in split_records(pulled.records.data)]


@pytest.mark.parametrize("store_files", ["laptop", "production"])
def test_cluster_ups_store_node_config_sizes_the_files_as_asked(
    tmp_path: Path, store_files: str
) -> None:
    """``--store-files laptop`` (the default) writes small files' sizes into the
    store-nodes' config; ``production`` writes none, so RocketMQ's defaults hold
    (what the benchmarks measure). Read by the store-node's own settings layer."""
    from basalt.services import config
    from basalt.services.cluster.local import LAPTOP_STORE_CONFIG, write_store_node_config
    from basalt.services.store_node.main import SPEC
    from basalt.store import MessageStoreConfig

    path = write_store_node_config(tmp_path, store_files)
    resolved = config.resolve(
        SPEC, flags={"name": "b", "data_dir": str(tmp_path)}, config_file=path
    )
    store = resolved.build(MessageStoreConfig)
    if store_files == "laptop":
        assert (
            store.mapped_file_size_commit_log == LAPTOP_STORE_CONFIG["mapped_file_size_commit_log"]
        )
        assert store.max_index_num == LAPTOP_STORE_CONFIG["max_index_num"]
    else:
        assert store.mapped_file_size_commit_log == 1024 * 1024 * 1024
        assert store.max_index_num == 20_000_000
        assert resolved.values["max_index_num"].source == "default"

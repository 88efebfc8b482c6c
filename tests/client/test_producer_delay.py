"""Delay levels through the SDK and the CLI, end to end (real etcd, real store-nodes)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from basalt.client import Producer
from basalt.common.message import Message
from basalt.services.meta import MetaConfig
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.polling import eventually
from tests.support.processes import run_basalt
from tests.support.rpc import pull_queue


@async_test
async def test_a_message_sent_with_delay_level_1_is_consumed_after_a_second(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        async with Producer(h.services[0].address, group="P") as producer:
            started = time.monotonic()
            r = await producer.send(
                Message(TOPIC, b"delayed", tags="TagA", keys=("k1",), delay_time_level=1)
            )
            assert r.ok
            assert await pull_queue(h.stub, r.broker_name, r.queue_id, commit=False) == []

            async def arrived() -> bool:
                bodies = await pull_queue(h.stub, r.broker_name, r.queue_id, commit=False)
                return bodies == [b"delayed"]

            await eventually(arrived, timeout_s=15, what="the delayed message")
            assert time.monotonic() - started >= 1.0

            with pytest.raises(ValueError, match="cannot be batched"):
                await producer.send_batch(
                    [Message(TOPIC, b"a", delay_time_level=1), Message(TOPIC, b"b")]
                )

        code, out, err = await run_basalt(
            "produce", "--endpoints", h.services[0].address, "-t", "CliDelay", "-n", "1",
            "--delay-level", "2",
        )  # fmt: skip
        assert code == 0, err
        assert "SEND_OK" in out

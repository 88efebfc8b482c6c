"""``basalt produce`` / ``basalt consume`` run as a user would (``python -m
basalt.admin`` processes) against real etcd, store-nodes and a pull-service."""

from __future__ import annotations

from pathlib import Path

from basalt.services.meta import MetaConfig
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.processes import run_basalt as basalt
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_produce_then_consume_with_tags_sql_and_count(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        ep = ("--endpoints", h.services[0].address)
        code, out, err = await basalt(
            "produce", *ep, "-t", TOPIC, "-n", "30", "--batch", "5", "--tags", "a,b", "--size", "16"
        )
        assert code == 0, err
        assert out.count("SendResult [status=SEND_OK") == 6  # one line per batch
        assert "sent 30 messages" in out
        code, out, err = await basalt("produce", *ep, "-t", TOPIC, "-n", "4", "-v")
        assert (code, out.count("SendResult [status=SEND_OK")) == (0, 4), err

        code, out, err = await basalt("consume", *ep, "-t", TOPIC, "-g", "Q1", "--idle-ms", "300")
        assert code == 0, err
        assert "received 34 messages" in out
        code, out, _ = await basalt(
            "consume", *ep, "-t", TOPIC, "-g", "Q2", "-s", "a", "--idle-ms", "300"
        )
        assert "received 15 messages" in out and "tags=b" not in out
        code, out, _ = await basalt(
            "consume", *ep, "-t", TOPIC, "-g", "Q3", "--count", "7", "--idle-ms", "300"
        )
        assert "received 7 messages" in out
        # Only those 7 were committed: the group goes on with the other 27.
        code, out, _ = await basalt("consume", *ep, "-t", TOPIC, "-g", "Q3", "--idle-ms", "300")
        assert "received 27 messages" in out
        # The first group committed: consuming again finds nothing new.
        code, out, _ = await basalt("consume", *ep, "-t", TOPIC, "-g", "Q1", "--idle-ms", "200")
        assert "received 0 messages" in out

        code, _, err = await basalt("consume", *ep, "-t", "NoSuchTopic", "-g", "Q1")
        assert code == 1 and "TOPIC_NOT_EXIST" in err
        code, _, err = await basalt("consume", *ep, "-t", TOPIC, "-g", "Q1", "--sql", "a >")
        assert code == 1 and "SUBSCRIPTION_PARSE_FAILED" in err
        code, _, err = await basalt("produce", *ep, "-t", TOPIC, "-n", "0")
        assert code == 2 and "--count" in err

"""``basalt admin clusterList / brokerStatus / electMaster`` on broker groups, run as
a user would (``python -m basalt.admin`` processes) against real etcd holding
group registrations put here (docs/admin.md#broker-groups)."""

from __future__ import annotations

import json

from basalt.services.cluster.etcd import free_port
from basalt.services.meta import (
    BrokerGroup,
    BrokerRegistration,
    MemberRegistration,
    MetaClient,
    MetaConfig,
)
from tests.support.aio import async_test
from tests.support.processes import run_basalt as basalt
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S

#: Reported max offsets: the master, an in-sync slave, a slave left out of the set.
MAX_OFFSETS = {0: 5000, 1: 4000, 2: 1000}


async def _broker_a(meta: MetaClient) -> list[BrokerGroup]:
    """broker-a: members 0 (master), 1 (in sync), 2 (not in sync), on ports nobody serves."""
    groups = [BrokerGroup(meta, "broker-a", i) for i in MAX_OFFSETS]
    for g in groups:
        await g.register(
            MemberRegistration(
                broker_name="broker-a",
                broker_id=g.broker_id,
                address=f"127.0.0.1:{free_port()}",
                store_root_id=f"root-{g.broker_id}",
                max_offset=MAX_OFFSETS[g.broker_id],
                confirm_offset=3500,
                epoch=1,
            ),
            3,
        )
    await groups[0].bootstrap()
    assert await groups[0].change_sync_state_set(master_id=0, epoch=1, new_set=frozenset({0, 1}))
    return groups


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_cluster_list_and_broker_status_show_the_group(meta_config: MetaConfig) -> None:
    etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster)
    async with MetaClient(meta_config) as meta:
        await _broker_a(meta)
        # A store-node outside any group, as every cluster had before groups.
        await meta.register(
            BrokerRegistration(
                broker_name="broker-b",
                address=f"127.0.0.1:{free_port()}",
                store_root_id="root-b",
                started_at_ms=1_700_000_000_000,
            )
        )

        code, out, err = await basalt("admin", "clusterList", "--json", *etcd)
        assert code == 0, err
        rows = json.loads(out)
        a_rows = [r for r in rows if r["broker"] == "broker-a"]
        assert [(r["id"], r["role"], r["in_sync"]) for r in a_rows] == [
            (0, "MASTER", "yes"),
            (1, "SLAVE", "yes"),
            (2, "SLAVE", "no"),
        ]
        assert [r["lag"] for r in a_rows] == [0, 1000, 4000]
        assert [r["max_offset"] for r in a_rows] == [5000, 4000, 1000]
        assert {r["confirm_offset"] for r in a_rows} == {3500}
        assert {r["put_tps"] for r in rows} == {"(no answer)"}  # nobody serves those ports
        (b_row,) = [r for r in rows if r["broker"] == "broker-b"]
        assert (b_row["role"], b_row["in_sync"], b_row["perm"]) == ("MASTER", "", 6)

        code, out, err = await basalt("admin", "clusterList", *etcd)
        assert code == 0, err
        assert "MASTER" in out and "SLAVE" in out and "in_sync" in out.splitlines()[0]

        code, out, err = await basalt("admin", "brokerStatus", "-b", "broker-a", "--json", *etcd)
        assert code == 0, err
        status = {r["key"]: r["value"] for r in json.loads(out)}
        assert status["groupMaster"] == 0 and status["groupEpoch"] == 1
        assert status["groupSyncStateSet"] == "0,1"
        assert status["member1"].startswith("SLAVE") and "lag=1000" in status["member1"]
        assert "not in-sync" in status["member2"]
        code, _, err = await basalt("admin", "brokerStatus", "-b", "broker-z", *etcd)
        assert code == 1 and "broker-z" in err


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_elect_master(meta_config: MetaConfig) -> None:
    etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster, "--json")

    async def elect(*args: str) -> tuple[int, dict[str, object], str]:
        code, out, err = await basalt("admin", "electMaster", "-b", "broker-a", *args, *etcd)
        return code, ({r["key"]: r["value"] for r in json.loads(out)} if code == 0 else {}), err

    async with MetaClient(meta_config) as meta:
        groups = await _broker_a(meta)

        code, _, err = await elect("-n", "2")
        assert code == 1 and "not in the in-sync set [0, 1]" in err
        code, _, err = await elect("-n", "9", "--unclean")
        assert code == 1 and "member 9 cannot become master: it is not registered" in err

        code, result, err = await elect("-n", "1")
        assert code == 0, err
        assert (result["master"], result["epoch"], result["syncStateSet"]) == (1, 2, "1")
        assert result["result"] == "elected" and "warning" not in result
        state, _ = await groups[0].state()
        assert state is not None and state.master_id == 1

        code, result, err = await elect("-n", "1")
        assert code == 0 and result["result"] == "already the master: unchanged"
        assert result["epoch"] == 2

        # Unclean: member 2 lacks what the old master (1, at 4000) had above its 1000.
        code, result, err = await elect("-n", "2", "--unclean")
        assert code == 0, err
        assert (result["master"], result["epoch"], result["previousMaster"]) == (2, 3, 1)
        warning = str(result["warning"])
        assert "3000 bytes" in warning and "[1000, 4000)" in warning

        code, _, err = await basalt("admin", "electMaster", "-b", "broker-b", "-n", "0", *etcd)
        assert code == 1 and "broker-b" in err and "has no state" in err

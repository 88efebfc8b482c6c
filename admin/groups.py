"""Replicated broker groups for the operator: clusterList's and brokerStatus'
group lines, and electMaster (docs/admin.md#broker-groups, docs/replication.md).

Everything here is read from etcd (``groups/<broker>/state`` and its members'
registrations, which carry their max and confirm offsets as last reported,
every few hundred ms) and, for the runtime figures, from each store-node at its
registered address. :func:`elect_master` is the controller's compare-and-swap
(basalt.services.meta.groups.BrokerGroup.elect); its refusals are
``ElectionRefusedError`` / ``GroupNotFoundError`` (MetaErrors), printed as
they are.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from basalt.common import dial
from basalt.services.meta import BrokerRegistration, GroupState, MemberRegistration, Perm
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

if TYPE_CHECKING:
    from basalt.services.meta import MetaClient

CALL_TIMEOUT_S = 5.0
#: The address column of a member the state names but whose lease has ended.
NOT_REGISTERED = "(not registered)"


@dataclass(frozen=True, slots=True)
class MemberRow:
    """One member of a group as etcd has it (``address`` is :data:`NOT_REGISTERED`
    for a master or in-sync member without a live registration)."""

    broker_name: str
    broker_id: int
    #: MASTER per the group state, else SLAVE.
    role: str
    address: str
    #: The member's own last epoch (its epoch file's newest entry).
    epoch: int | None
    in_sync: bool
    max_offset: int | None
    confirm_offset: int | None
    #: The master's reported max offset less this member's (None: either unknown).
    lag: int | None


def member_rows(
    broker_name: str, state: GroupState, members: dict[int, MemberRegistration]
) -> list[MemberRow]:
    """The group's members, the master first, then by id; the state's master and
    in-sync members appear even when not registered."""
    master = members.get(state.master_id)
    rows = []
    ids = sorted(set(members) | state.sync_state_set, key=lambda i: (i != state.master_id, i))
    for broker_id in ids:
        m = members.get(broker_id)
        rows.append(
            MemberRow(
                broker_name=broker_name,
                broker_id=broker_id,
                role="MASTER" if broker_id == state.master_id else "SLAVE",
                address=m.address if m else NOT_REGISTERED,
                epoch=m.epoch if m else None,
                in_sync=broker_id in state.sync_state_set,
                max_offset=m.max_offset if m else None,
                confirm_offset=m.confirm_offset if m else None,
                lag=max(0, master.max_offset - m.max_offset) if m and master else None,
            )
        )
    return rows


CLUSTER_HEADER = [
    "broker",
    "id",
    "role",
    "address",
    "epoch",
    "in_sync",
    "max_offset",
    "confirm_offset",
    "lag",
    "perm",
    "put_tps",
    "disk_ratio",
    "commit_log_max",
]


async def cluster_rows(meta: MetaClient) -> list[list[object]]:
    """clusterList's table: a row per member of each replicated group (its
    role, epoch, in-sync membership, reported offsets and lag behind the
    master, from etcd) and per store-node outside any group, each with its
    runtime figures (``(no answer)`` when it did not answer)."""
    brokers = await meta.list_brokers()
    groups = await meta.list_groups()
    addresses = {b.address for name, b in brokers.items() if name not in groups}
    for _, members in groups.values():
        addresses |= {m.address for m in members.values()}
    ordered = sorted(addresses)
    infos = dict(
        zip(ordered, await asyncio.gather(*(_info(meta, a) for a in ordered)), strict=True)
    )
    rows: list[list[object]] = []
    for name in sorted(set(brokers) | set(groups)):
        route = brokers.get(name)
        if name not in groups:
            assert route is not None
            info = infos.get(route.address)
            rows.append(
                [
                    name,
                    route.broker_id,
                    "MASTER",
                    route.address,
                    route.epoch,
                    "",
                    info.commit_log_max_offset if info else "",
                    "",
                    "",
                    int(route.perm),
                    *_figures(info),
                ]
            )
            continue
        state, members = groups[name]
        for row in member_rows(name, state, members):
            info = infos.get(row.address)
            perm = _route_perm(route, row.broker_id)
            rows.append(
                [
                    name,
                    row.broker_id,
                    row.role,
                    row.address,
                    _blank(row.epoch),
                    "yes" if row.in_sync else "no",
                    _blank(row.max_offset),
                    _blank(row.confirm_offset),
                    _blank(row.lag),
                    perm,
                    *(_figures(info) if row.address != NOT_REGISTERED else ("", "", "")),
                ]
            )
    return rows


def group_status(state: GroupState, rows: list[MemberRow]) -> list[list[object]]:
    """brokerStatus' group lines (key, value)."""
    lines: list[list[object]] = [
        ["groupMaster", state.master_id],
        ["groupEpoch", state.epoch],
        ["groupSyncStateSet", ",".join(map(str, sorted(state.sync_state_set)))],
        ["groupVersion", state.version],
    ]
    for r in rows:
        figures = (
            f"max={r.max_offset} confirm={r.confirm_offset} lag={r.lag} epoch={r.epoch}"
            if r.max_offset is not None
            else ""
        )
        sync = "in-sync" if r.in_sync else "not in-sync"
        lines.append([f"member{r.broker_id}", f"{r.role} {r.address} {sync} {figures}".rstrip()])
    return lines


@dataclass(frozen=True, slots=True)
class ElectOutcome:
    """What electMaster did: the state before and after (equal: the target was
    already master), and what an unclean election may have lost ("" if none)."""

    before: GroupState
    after: GroupState
    warning: str


async def elect_master(
    meta: MetaClient, broker_name: str, target_id: int, *, unclean: bool
) -> ElectOutcome:
    """Move ``broker_name``'s mastership to member ``target_id`` (an in-sync
    member; with ``unclean``, any live one). An unclean election's warning
    names the records that may be lost: those the old master reported above
    the target's max offset. Raises GroupNotFoundError, ElectionRefusedError
    (not registered; not in sync without unclean), MetaConflictError."""
    from basalt.services.meta.groups import BrokerGroup

    group = BrokerGroup(meta, broker_name, target_id)
    before, members = await meta.get_group(broker_name)
    after = await group.elect(target_id, unclean=unclean)
    warning = ""
    if before is not None and after != before and target_id not in before.sync_state_set:
        warning = _loss_warning(before, members, target_id)
    return ElectOutcome(before or after, after, warning)


def _loss_warning(before: GroupState, members: dict[int, MemberRegistration], target: int) -> str:
    new = members.get(target)
    old = members.get(before.master_id)
    at = new.max_offset if new else 0
    if old is None:
        return (
            f"unclean election: member {target} was not in the in-sync set; the old master "
            f"{before.master_id} is not registered, so whatever it had above offset {at} "
            f"(member {target}'s max offset) may be lost"
        )
    lost = max(0, old.max_offset - at)
    return (
        f"unclean election: member {target} was not in the in-sync set; {lost} bytes of "
        f"CommitLog may be lost: the old master {before.master_id} reported max offset "
        f"{old.max_offset}, member {target} {at} (records in [{at}, {old.max_offset}))"
    )


def _route_perm(route: BrokerRegistration | None, broker_id: int) -> object:
    """The route's perm on the row of the member that published it."""
    if route is None or route.broker_id != broker_id:
        return ""
    return int(Perm(route.perm))


def _blank(value: int | None) -> object:
    return "" if value is None else value


def _figures(info: sn.GetRuntimeInfoResponse | None) -> tuple[object, object, object]:
    if info is None:
        return "(no answer)", "", ""
    return f"{info.put_tps:.1f}", f"{info.disk_use_ratio:.2f}", info.commit_log_max_offset


async def _info(meta: MetaClient, address: str) -> sn.GetRuntimeInfoResponse | None:
    try:
        async with dial.channel(address, meta.tls) as channel:
            stub = sn_grpc.StoreNodeStub(channel)
            return await stub.GetRuntimeInfo(sn.GetRuntimeInfoRequest(), timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError:
        return None

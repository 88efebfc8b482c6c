"""The values of a replicated broker group (docs/replication.md): its state and its members.

Keys (``/basalt/<cluster>/`` +) ``groups/<broker>/state`` and
``groups/<broker>/members/<id>``; their JSON shapes are in
:mod:`basalt.services.meta.model`'s docstring, which re-exports these values.
Validated at construction like every metadata value; decoded strictly, unknown
fields ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from basalt.services.meta.errors import MetaValidationError
from basalt.services.meta.fields import (
    check_address,
    check_broker_id,
    check_name,
    check_non_negative,
    decode_object,
    dumps,
    get_identity,
    get_int,
    get_list,
    get_str,
    prefixed,
)


def _broker_ids(ids: object, where: str) -> frozenset[int]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise MetaValidationError(f"{where}: sync_state_set must be broker ids, got {ids!r}")
    return frozenset(check_broker_id(i) for i in ids)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupState:
    """A broker group's controller state (RocketMQ's SyncStateInfo), key
    ``groups/<broker>/state``: durable, changed only by compare-and-swap
    (basalt.services.meta.groups). The master is always in the in-sync set."""

    #: The member that takes sends (its broker id).
    master_id: int
    #: The master's term: grows by one at each election, never otherwise.
    epoch: int
    #: The members that may become master without losing an acknowledged send.
    sync_state_set: frozenset[int]
    #: Grows by one at every change of the state (RocketMQ's syncStateSetEpoch).
    version: int

    def __post_init__(self) -> None:
        where = "group state"
        try:
            check_broker_id(self.master_id)
            object.__setattr__(self, "sync_state_set", _broker_ids(self.sync_state_set, where))
        except MetaValidationError as e:
            raise prefixed(where, e) from None
        for name in ("epoch", "version"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MetaValidationError(f"{where}: {name} must be an integer >= 1, got {value!r}")
        if self.master_id not in self.sync_state_set:
            raise MetaValidationError(
                f"{where}: master {self.master_id} is not in its in-sync set "
                f"{sorted(self.sync_state_set)}"
            )

    def to_json(self) -> bytes:
        return dumps(
            {
                "master_id": self.master_id,
                "epoch": self.epoch,
                "sync_state_set": sorted(self.sync_state_set),
                "version": self.version,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str, *, broker_name: str | None = None) -> GroupState:
        where = f"groups/{broker_name}/state" if broker_name is not None else "group state"
        return decode_object(
            raw,
            where,
            lambda data: cls(
                master_id=get_int(data, "master_id", where),
                epoch=get_int(data, "epoch", where),
                sync_state_set=_broker_ids(get_list(data, "sync_state_set", where), where),
                version=get_int(data, "version", where),
            ),
        )


class MemberRole(enum.StrEnum):
    """What a member believes it is (the group state has the final word)."""

    MASTER = "MASTER"
    SLAVE = "SLAVE"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberRegistration:
    """A live member of a broker group, key ``groups/<broker>/members/<id>``,
    under the member's own lease (``ha_lease_ttl_s``): the key is gone once
    the member stops renewing it, which is what starts an election."""

    broker_name: str
    broker_id: int
    #: The member's gRPC address (replication, admin).
    address: str
    #: The address clients are given once it is master; empty: ``address``.
    client_address: str = ""
    store_root_id: str
    #: The member's CommitLog max offset, as last reported.
    max_offset: int = 0
    #: The member's confirm offset, as last reported.
    confirm_offset: int = 0
    #: The member's last epoch (its epoch file's newest entry).
    epoch: int = 0
    role: MemberRole = MemberRole.SLAVE

    def __post_init__(self) -> None:
        check_name(self.broker_name, "broker name")
        check_broker_id(self.broker_id)
        where = f"member {self.broker_name}/{self.broker_id}"
        try:
            check_address(self.address, "address")
            if self.client_address:
                check_address(self.client_address, "client_address")
            for name in ("max_offset", "confirm_offset", "epoch"):
                check_non_negative(getattr(self, name), name)
            object.__setattr__(self, "role", MemberRole(self.role))
        except ValueError as e:
            raise MetaValidationError(f"{where}: {e}") from None
        if not isinstance(self.store_root_id, str) or not self.store_root_id:
            raise MetaValidationError(f"{where}: store_root_id must be a non-empty string")

    def key_suffix(self) -> str:
        return f"groups/{self.broker_name}/members/{self.broker_id}"

    def to_json(self) -> bytes:
        return dumps({**asdict(self), "role": self.role.value})

    @classmethod
    def from_json(
        cls, raw: bytes | str, *, broker_name: str | None = None, broker_id: int | None = None
    ) -> MemberRegistration:
        where = (
            f"groups/{broker_name}/members/{broker_id}"
            if broker_name is not None
            else "member registration"
        )

        def make(data: dict[str, object]) -> MemberRegistration:
            member_id = get_int(data, "broker_id", where)
            if broker_id is not None and member_id != broker_id:
                raise MetaValidationError(
                    f"{where}: field 'broker_id' is {member_id} but the key says {broker_id}"
                )
            return cls(
                broker_name=get_identity(data, "broker_name", broker_name, where),
                broker_id=member_id,
                address=get_str(data, "address", where),
                client_address=get_str(data, "client_address", where, ""),
                store_root_id=get_str(data, "store_root_id", where),
                max_offset=get_int(data, "max_offset", where, 0),
                confirm_offset=get_int(data, "confirm_offset", where, 0),
                epoch=get_int(data, "epoch", where, 0),
                role=MemberRole(get_str(data, "role", where, MemberRole.SLAVE)),
            )

        return decode_object(raw, where, make)


#: A value under ``groups/<broker>/``: its state or one of its members.
GroupEntry = GroupState | MemberRegistration


def decode_group_entry(broker_name: str, name: str, raw: bytes) -> GroupEntry:
    """The value of ``groups/<broker_name>/<name>``: ``state`` or ``members/<id>``.
    Raises MetaValidationError for anything else (a hand-made key)."""
    if name == "state":
        return GroupState.from_json(raw, broker_name=broker_name)
    kind, _, ident = name.partition("/")
    if kind == "members" and ident.isdigit():
        return MemberRegistration.from_json(raw, broker_name=broker_name, broker_id=int(ident))
    raise MetaValidationError(f"groups/{broker_name}/{name} is not a group state or member key")


def campaign_order(member: MemberRegistration) -> tuple[int, int, int]:
    """The sort key of the campaign order: the newest epoch, then the furthest
    max offset, then the lowest id (RocketMQ's DefaultElectPolicy order)."""
    return (-member.epoch, -member.max_offset, member.broker_id)


def election_rank(
    state: GroupState, members: dict[int, MemberRegistration], broker_id: int
) -> int | None:
    """``broker_id``'s place in the campaign order after the master's lease
    ended (docs/replication.md#election-and-fencing): among the live in-sync
    members but the old master, the newest epoch first, then the furthest max
    offset, then the lowest id (RocketMQ's DefaultElectPolicy order). 0 goes
    first; a member waits ``ha_election_delay_ms`` x its rank. None: it is not
    a live in-sync member, so it does not campaign (unless unclean)."""
    candidates = [
        m for i, m in members.items() if i in state.sync_state_set and i != state.master_id
    ]
    candidates.sort(key=campaign_order)
    for rank, member in enumerate(candidates):
        if member.broker_id == broker_id:
            return rank
    return None

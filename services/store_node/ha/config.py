"""A store-node's replication settings (docs/replication.md#settings).

RocketMQ 5's controller-mode names in snake_case where they exist
(``allAckInSyncStateSet`` is ``replica_ack_mode`` SYNC, ``minInSyncReplicas``,
``haMaxTimeSlaveNotCatchup``, ``enableElectUncleanMaster``); the rest are
Basalt's. Every member of a group should carry the same group settings
(ack mode, minimum, timings): each member enforces what it was started with.
"""

from __future__ import annotations

import enum

from basalt.common.settings import (
    boolean,
    check,
    config_dataclass,
    non_negative,
    one_of,
    positive,
    setting,
    validate,
)


class ReplicaAckMode(enum.Enum):
    """When a master acknowledges a send (RocketMQ's SYNC_MASTER / ASYNC_MASTER)."""

    #: Once every member of the in-sync set has it (``allAckInSyncStateSet``).
    SYNC = "SYNC"
    #: Once the master has it.
    ASYNC = "ASYNC"


@config_dataclass
class ReplicationConfig:
    """One member of a broker group. Validated at construction: ValueError names
    the first bad field."""

    broker_id: int = setting(
        default=0,
        check=non_negative,
        doc="This member's id in its broker group (RocketMQ's brokerId); unique in the group.",
    )
    replica_ack_mode: ReplicaAckMode = setting(
        default=ReplicaAckMode.SYNC,
        check=one_of(*ReplicaAckMode),
        doc="SYNC acknowledges a send once every in-sync member has it (RocketMQ's "
        "allAckInSyncStateSet, Kafka's acks=all); ASYNC once the master has it.",
    )
    min_in_sync_replicas: int = setting(
        default=1,
        check=positive,
        doc="Fewer in-sync members than this refuses sends (IN_SYNC_REPLICAS_NOT_ENOUGH) "
        "rather than keep a single copy (RocketMQ's minInSyncReplicas).",
    )
    ha_max_time_slave_not_catchup_ms: int = setting(
        default=15_000,
        check=positive,
        doc="A slave that has not caught up with the master for this long leaves the "
        "in-sync set (RocketMQ's haMaxTimeSlaveNotCatchup).",
    )
    enable_elect_unclean_master: bool = setting(
        default=False,
        check=boolean,
        doc="A member outside the in-sync set may campaign when no in-sync member is "
        "alive; what it lacks of the old master's log is lost (RocketMQ's "
        "enableElectUncleanMaster).",
    )
    ha_lease_ttl_s: int = setting(
        default=3,
        check=check(
            "2..60", lambda v: isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= 60
        ),
        doc="TTL of a member's etcd lease: how long a dead master keeps its group without one.",
    )
    ha_fence_margin_ms: int = setting(
        default=1_000,
        check=positive,
        doc="A master stops acknowledging sends when its lease was last renewed "
        "longer than ha_lease_ttl_s minus this ago: before the lease can expire.",
    )
    ha_election_delay_ms: int = setting(
        default=100,
        check=non_negative,
        doc="A campaigning member waits this times its rank by max offset, so the "
        "member furthest ahead campaigns first.",
    )
    ha_heartbeat_interval_ms: int = setting(
        default=200,
        check=positive,
        doc="An idle master's heartbeat to each slave, carrying the confirm offset.",
    )
    ha_offset_sync_interval_ms: int = setting(
        default=1_000,
        check=positive,
        doc="How often the master sends its consumer offsets and pop state to its "
        "slaves: about what a failover redelivers.",
    )
    ha_transfer_batch_size_bytes: int = setting(
        default=1 << 20,
        check=positive,
        doc="Largest CommitLog frame sent to a slave (RocketMQ's haTransferBatchSize).",
    )

    def __post_init__(self) -> None:
        validate(self, ValueError)
        if self.ha_fence_margin_ms >= self.ha_lease_ttl_s * 1000:
            raise ValueError(
                f"ha_fence_margin_ms must be below ha_lease_ttl_s in ms "
                f"({self.ha_lease_ttl_s * 1000}), got {self.ha_fence_margin_ms}"
            )

"""Store configuration: one frozen dataclass, RocketMQ's names in snake_case.

Built once at the process edge and passed down. Units are in the names.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from pathlib import Path

from basalt.common.settings import (
    at_least,
    between,
    boolean,
    check,
    config_dataclass,
    from_validator,
    instance_of,
    multiple_of,
    non_negative,
    one_of,
    percentage,
    positive,
    setting,
    validate,
)
from basalt.store.errors import StoreConfigError

#: Bytes of one ConsumeQueue unit: phyOffset(8) + size(4) + tagsCode(8).
CQ_STORE_UNIT_SIZE = 20
#: RocketMQ's default ConsumeQueue file: 300,000 units.
DEFAULT_CQ_UNITS_PER_FILE = 300_000


def parse_delete_hours(delete_when: str) -> frozenset[int]:
    """RocketMQ's ``deleteWhen``: hours separated by ';' ("04", "04;16").

    Raises ValueError when it does not parse.
    """
    hours = frozenset(int(h) for h in delete_when.split(";") if h.strip())
    if not hours or not all(0 <= h <= 23 for h in hours):
        raise ValueError(delete_when)
    return hours


class FlushDiskType(enum.Enum):
    """When a send is acknowledged relative to fsync."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


#: RocketMQ's messageDelayLevel units, in ms.
_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: The most delay levels: SCHEDULE_TOPIC_XXXX has one queue per level.
MAX_DELAY_LEVELS = 64


@functools.lru_cache(maxsize=16)
def parse_delay_levels(message_delay_level: str) -> tuple[int, ...]:
    """RocketMQ's ``messageDelayLevel``: space-separated delays, each a positive
    integer and a unit of s, m, h or d ("1s 5s 10s 30s 1m ... 2h"). Returns
    level ``i``'s delay in ms at index ``i - 1``.

    Raises ValueError when it does not parse, is empty or has more than
    :data:`MAX_DELAY_LEVELS` levels.
    """
    delays = []
    for word in message_delay_level.split():
        amount, unit = word[:-1], word[-1:]
        if unit not in _DELAY_UNITS_MS or not amount.isascii() or not amount.isdigit():
            raise ValueError(f"{word!r} is not a number and a unit of s, m, h or d")
        if int(amount) <= 0:
            raise ValueError(f"{word!r} is not a positive delay")
        delays.append(int(amount) * _DELAY_UNITS_MS[unit])
    if not 1 <= len(delays) <= MAX_DELAY_LEVELS:
        raise ValueError(f"{len(delays)} delay levels: 1-{MAX_DELAY_LEVELS} allowed")
    return tuple(delays)


def _is_ip_port(store_host: object) -> bool:
    """``ip:port``: an IPv4 or bracketed IPv6 address, a port in 0..65535."""
    if not isinstance(store_host, str):
        return False
    host, sep, port = store_host.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return bool(sep) and port.isdigit() and 0 <= int(port) < 65536


_store_host = check("'ip:port'", _is_ip_port)
_message_delay_level = instance_of(str, "a string") & from_validator(
    "delays like '1s 5s 1m 2h' (units s, m, h, d)", parse_delay_levels
)
_delete_when = instance_of(str, "a string") & from_validator(
    "hours 00-23 separated by ';'", parse_delete_hours
)


@config_dataclass
class MessageStoreConfig:
    """Everything the storage engine can be told. Validated at construction:
    :class:`StoreConfigError` names the first bad field."""

    store_path_root_dir: Path = setting(
        check=instance_of(Path, "a path"),
        doc="The store's root directory (a str is taken too); everything lives below it.",
    )
    mapped_file_size_commit_log: int = setting(
        default=1 << 30, check=at_least(4096), unit="bytes", doc="Bytes of one CommitLog file."
    )
    mapped_file_size_consume_queue: int = setting(
        default=DEFAULT_CQ_UNITS_PER_FILE * CQ_STORE_UNIT_SIZE,
        check=positive & multiple_of(CQ_STORE_UNIT_SIZE),
        unit="bytes",
        doc="Bytes of one ConsumeQueue file: a whole number of 20-byte units.",
    )
    max_open_consume_queue_files: int = setting(
        default=4096,
        check=positive,
        doc=(
            "ConsumeQueue files kept open at once (an LRU shared by every queue; the "
            "least recently used idle file is closed and reopened on demand), so the "
            "store's file descriptors do not grow with its queues."
        ),
    )
    flush_disk_type: FlushDiskType = setting(
        default=FlushDiskType.ASYNC_FLUSH,
        check=one_of(*FlushDiskType),
        doc="SYNC_FLUSH acknowledges a send after its fsync; ASYNC_FLUSH before.",
    )
    flush_interval_commit_log_ms: int = setting(
        default=500, check=positive, doc="How often the CommitLog flusher looks (ASYNC_FLUSH)."
    )
    flush_commit_log_least_pages: int = setting(
        default=4,
        check=non_negative,
        doc="Dirty 4 KiB pages the CommitLog flusher waits for (0: flush whatever there is).",
    )
    flush_commit_log_thorough_interval_ms: int = setting(
        default=10_000,
        check=non_negative,
        doc="The CommitLog is flushed whatever its dirty pages once this long has passed.",
    )
    flush_interval_consume_queue_ms: int = setting(
        default=1000, check=positive, doc="How often the ConsumeQueue flusher looks."
    )
    flush_consume_queue_least_pages: int = setting(
        default=2,
        check=non_negative,
        doc=(
            "RocketMQ's flushConsumeQueueLeastPages, taken for its name: Basalt's "
            "ConsumeQueue flusher flushes whatever is dirty every "
            "flush_interval_consume_queue_ms."
        ),
    )
    flush_consume_queue_thorough_interval_ms: int = setting(
        default=60_000,
        check=non_negative,
        doc="RocketMQ's flushConsumeQueueThoroughInterval, taken for its name (as above).",
    )
    sync_flush_timeout_ms: int = setting(
        default=5000,
        check=positive,
        doc="A SYNC_FLUSH send waits this long for its fsync (then FLUSH_DISK_TIMEOUT).",
    )
    max_message_size: int = setting(
        default=4 * 1024 * 1024,
        check=positive,
        unit="bytes",
        doc="The largest message body a send may carry.",
    )
    check_crc_on_recover: bool = setting(
        default=True,
        check=boolean,
        doc="Recovery checks every record's CRC and stops at a bad one.",
    )
    enabled_append_prop_crc: bool = setting(
        default=True,
        check=boolean,
        doc=(
            "RocketMQ's enabledAppendPropCRC: messages the store encodes end with the "
            "__CRC32# property, a checksum of the whole record that recovery and "
            "'store check' verify. Off, they carry BODYCRC only; a producer's batch "
            "that reserved the property still gets it filled."
        ),
    )
    enable_controller_mode: bool = setting(
        default=False,
        check=boolean,
        doc=(
            "RocketMQ's enableControllerMode: the store is a member of a replicated group. "
            "The dispatcher builds ConsumeQueues and the index only up to the confirm "
            "offset (what every in-sync member has), the checkpoint keeps that offset, "
            "and a restart dispatches no further (see docs/replication.md)."
        ),
    )
    store_host: str = setting(
        default="127.0.0.1:10911",
        check=_store_host,
        doc="Host:port written into every record's STOREHOST and every offset msg id.",
    )
    reput_batch_size_bytes: int = setting(
        default=4 * 1024 * 1024,
        check=positive,
        doc="Upper bound on CommitLog bytes the dispatcher reads per step.",
    )
    # RocketMQ caps a pull from memory at 32 records / 256 KiB, sized for its
    # remoting protocol's per-request cost. A gRPC call costs far more here
    # (~0.5-1 ms of CPU), so Basalt's default is 1024 records / 1 MiB per queue
    # read: a consumer's pull of 256 gets 256. One default, here, for the
    # store-node and the library alike (the store-node's flags said so before).
    max_transfer_bytes_on_message_in_memory: int = setting(
        default=1024 * 1024,
        check=positive,
        unit="bytes",
        doc=(
            "Pull caps (RocketMQ's names; RocketMQ's defaults are 256 KiB / 32, Basalt "
            "serves more per gRPC call): a pull returns at most this many bytes and "
            "messages, always at least one message; records more than "
            "access_message_in_memory_max_ratio % of RAM behind the CommitLog's end "
            "are 'in disk' and get the smaller caps."
        ),
    )
    max_transfer_count_on_message_in_memory: int = setting(
        default=1024,
        check=positive,
        doc="The most messages a pull from memory returns (RocketMQ: 32).",
    )
    max_transfer_bytes_on_message_in_disk: int = setting(
        default=64 * 1024,
        check=positive,
        unit="bytes",
        doc="The most bytes a pull of records 'in disk' returns.",
    )
    max_transfer_count_on_message_in_disk: int = setting(
        default=8, check=positive, doc="The most messages a pull of records 'in disk' returns."
    )
    access_message_in_memory_max_ratio: int = setting(
        default=40,
        check=percentage,
        doc="Records within this % of RAM of the CommitLog's end count as in memory.",
    )
    message_index_enable: bool = setting(
        default=True,
        check=boolean,
        doc=(
            "IndexFile (RocketMQ's names): keys and UNIQ_KEY of every message, looked up "
            "by query_message."
        ),
    )
    max_hash_slot_num: int = setting(
        default=5_000_000, check=positive, doc="Hash slots of one IndexFile."
    )
    max_index_num: int = setting(
        default=20_000_000,
        check=positive,
        doc="An IndexFile holds max_index_num - 1 entries.",
    )
    max_msgs_num_batch: int = setting(
        default=64, check=positive, doc="The most records one query_message returns."
    )
    flush_consumer_offset_interval_ms: int = setting(
        default=5000,
        check=positive,
        doc="Consumer offsets are written to config/consumerOffset.json this often (if changed).",
    )
    file_reserved_time_hours: int = setting(
        default=72,
        check=non_negative,
        doc=(
            "Expiry (RocketMQ's CleanCommitLogService): CommitLog files whose last write "
            "is older than this are deleted at the delete_when hours, or at any hour "
            "once disk use passes disk_max_used_space_ratio."
        ),
    )
    delete_when: str = setting(
        default="04",
        check=_delete_when,
        doc="The hours old CommitLog files are deleted at: '04', or '04;16'.",
    )
    disk_max_used_space_ratio: int = setting(
        default=75,
        check=percentage,
        doc="Past this disk use, expired files are deleted at any hour.",
    )
    disk_space_clean_forcibly_ratio: int = setting(
        default=85,
        check=percentage,
        doc="Past this disk use, files are deleted even before they expire.",
    )
    disk_space_warning_level_ratio: int = setting(
        default=90, check=percentage, doc="Past this disk use, sends are refused."
    )
    clean_file_forcibly_enable: bool = setting(
        default=True,
        check=boolean,
        doc="Whether files are deleted before they expire past disk_space_clean_forcibly_ratio.",
    )
    clean_resource_interval_ms: int = setting(
        default=10_000, check=positive, doc="How often the expiry service looks."
    )
    delete_commit_log_files_interval_ms: int = setting(
        default=100, check=non_negative, doc="The pause between two deleted CommitLog files."
    )
    destroy_mapped_file_interval_forcibly_ms: int = setting(
        default=120_000,
        check=non_negative,
        doc="A file a reader still holds is deleted anyway this long after the first try.",
    )

    message_delay_level: str = setting(
        default="1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
        check=_message_delay_level,
        doc=(
            "RocketMQ's messageDelayLevel: the delay of each level a message may ask "
            "for (DELAY=n waits the n-th), space-separated, units s, m, h, d; at "
            f"most {MAX_DELAY_LEVELS} levels. See docs/scheduled.md."
        ),
    )
    flush_delay_offset_interval_ms: int = setting(
        default=10_000,
        check=positive,
        doc=(
            "RocketMQ's flushDelayOffsetInterval: config/delayOffset.json is written "
            "this often (if changed) and at shutdown."
        ),
    )

    timer_wheel_enable: bool = setting(
        default=True,
        check=boolean,
        doc=(
            "RocketMQ's timerWheelEnable: whether messages may ask for a delivery time "
            "(TIMER_DELIVER_MS and the like); off, such sends are refused. See docs/timers.md."
        ),
    )
    timer_precision_ms: int = setting(
        default=100,
        check=between(10, 1000),
        doc=(
            "RocketMQ's timerPrecisionMs: one timer wheel slot per this many ms; a timer "
            "message is delivered not before its time and about this much after."
        ),
    )
    timer_max_delay_sec: int = setting(
        default=7 * 86_400,
        check=positive,
        doc=(
            "RocketMQ's timerMaxDelaySec: the furthest ahead a message may ask to be "
            "delivered; later times are refused."
        ),
    )
    timer_roll_window_sec: int = setting(
        default=2 * 86_400,
        check=at_least(60),
        doc=(
            "RocketMQ's timerRollWindowSlot, in seconds: a timer message due later than "
            "this waits in the wheel this long, then is written to the timer topic again "
            "(a roll) so its CommitLog record never expires first; keep it well under "
            "file_reserved_time_hours. The wheel file has slots for twice this span."
        ),
    )
    mapped_file_size_timer_log: int = setting(
        default=100 << 20,
        check=at_least(4096),
        unit="bytes",
        doc="RocketMQ's mappedFileSizeTimerLog: bytes of one TimerLog file.",
    )
    timer_flush_interval_ms: int = setting(
        default=1000,
        check=positive,
        doc=(
            "RocketMQ's timerFlushIntervalMs: the TimerLog and wheel are fsynced and "
            "config/timercheck written this often (and at shutdown); a crash delivers "
            "again what was delivered since."
        ),
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "store_path_root_dir", Path(self.store_path_root_dir))
        validate(self, StoreConfigError)

    @property
    def delay_levels_ms(self) -> tuple[int, ...]:
        """Level ``i``'s delay in ms at index ``i - 1`` (``message_delay_level`` parsed;
        cached, as the put path and the dispatcher read it per scheduled message)."""
        return parse_delay_levels(self.message_delay_level)

    @property
    def timer_dir(self) -> Path:
        """The TimerLog's files (store.timer)."""
        return self.store_path_root_dir / "timerlog"

    @property
    def timer_wheel_path(self) -> Path:
        return self.store_path_root_dir / "timerwheel"

    @property
    def timer_checkpoint_path(self) -> Path:
        return self.store_path_root_dir / "config" / "timercheck"

    @property
    def delete_hours(self) -> frozenset[int]:
        """The hours of ``delete_when``."""
        return parse_delete_hours(self.delete_when)

    @property
    def quarantine_dir(self) -> Path:
        """Where recovery copies damaged bytes before it rewrites them."""
        return self.store_path_root_dir / "quarantine"

    @property
    def index_dir(self) -> Path:
        return self.store_path_root_dir / "index"

    @property
    def commitlog_dir(self) -> Path:
        return self.store_path_root_dir / "commitlog"

    @property
    def consume_queue_dir(self) -> Path:
        return self.store_path_root_dir / "consumequeue"

    @property
    def checkpoint_path(self) -> Path:
        return self.store_path_root_dir / "checkpoint"

    @property
    def abort_path(self) -> Path:
        return self.store_path_root_dir / "abort"

    @property
    def epoch_file_path(self) -> Path:
        """The epoch file (store.epoch_file)."""
        return self.store_path_root_dir / "epochFileCheckpoint"

    @property
    def truncate_marker_path(self) -> Path:
        """Present while a durable truncation is under way (store.replica_log)."""
        return self.store_path_root_dir / "truncate"

    @property
    def lock_path(self) -> Path:
        return self.store_path_root_dir / "lock"

    @property
    def config_dir(self) -> Path:
        return self.store_path_root_dir / "config"

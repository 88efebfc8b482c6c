"""Store configuration: one frozen dataclass, RocketMQ's names in snake_case.

Built once at the process edge and passed down. Units are in the names.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from basalt.store.errors import StoreConfigError

#: Bytes of one ConsumeQueue unit: phyOffset(8) + size(4) + tagsCode(8).
CQ_STORE_UNIT_SIZE = 20
#: RocketMQ's default ConsumeQueue file: 300,000 units.
DEFAULT_CQ_UNITS_PER_FILE = 300_000
#: Properties are stored behind a 2-byte signed length.
MAX_PROPERTIES_SIZE = 32767
#: Topic names are stored behind a 1-byte signed length.
MAX_TOPIC_LENGTH = 127


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


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageStoreConfig:
    """Everything the storage engine can be told. Validated at construction."""

    store_path_root_dir: Path
    mapped_file_size_commit_log: int = 1 << 30
    mapped_file_size_consume_queue: int = DEFAULT_CQ_UNITS_PER_FILE * CQ_STORE_UNIT_SIZE
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_commit_log_ms: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval_ms: int = 60_000
    sync_flush_timeout_ms: int = 5000
    max_message_size: int = 4 * 1024 * 1024
    check_crc_on_recover: bool = True
    #: Host:port written into every record's STOREHOST and every offset msg id.
    store_host: str = "127.0.0.1:10911"
    #: Upper bound on CommitLog bytes the dispatcher reads per step.
    reput_batch_size_bytes: int = 4 * 1024 * 1024
    #: Pull caps (RocketMQ's names): a pull returns at most this many bytes and
    #: messages, always at least one message; records more than
    #: ``access_message_in_memory_max_ratio`` % of RAM behind the CommitLog's end
    #: are "in disk" and get the smaller caps.
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    access_message_in_memory_max_ratio: int = 40
    #: IndexFile (RocketMQ's names): keys and UNIQ_KEY of every message, looked up by
    #: query_message; a file holds max_index_num - 1 entries in max_hash_slot_num slots.
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    #: The most records one query_message returns.
    max_msgs_num_batch: int = 64
    #: Consumer offsets are written to config/consumerOffset.json this often (if changed).
    flush_consumer_offset_interval_ms: int = 5000
    #: Expiry (RocketMQ's CleanCommitLogService): CommitLog files whose last write
    #: is older than this are deleted at the ``delete_when`` hours ("04", or
    #: "04;16"), or at any hour once disk use passes ``disk_max_used_space_ratio``
    #: percent; past ``disk_space_clean_forcibly_ratio`` even young files go, and
    #: past ``disk_space_warning_level_ratio`` sends are refused.
    file_reserved_time_hours: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    disk_space_clean_forcibly_ratio: int = 85
    disk_space_warning_level_ratio: int = 90
    clean_file_forcibly_enable: bool = True
    #: How often the expiry service looks, and the pause between two deleted files.
    clean_resource_interval_ms: int = 10_000
    delete_commit_log_files_interval_ms: int = 100
    #: A file a reader still holds is deleted anyway this long after the first try.
    destroy_mapped_file_interval_forcibly_ms: int = 120_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "store_path_root_dir", Path(self.store_path_root_dir))
        if self.mapped_file_size_commit_log < 4096:
            raise StoreConfigError("mapped_file_size_commit_log must be at least 4096 bytes")
        cq = self.mapped_file_size_consume_queue
        if cq < CQ_STORE_UNIT_SIZE or cq % CQ_STORE_UNIT_SIZE:
            raise StoreConfigError(
                f"mapped_file_size_consume_queue must be a positive multiple of "
                f"{CQ_STORE_UNIT_SIZE}, got {cq}"
            )
        for name in (
            "flush_interval_commit_log_ms",
            "flush_interval_consume_queue_ms",
            "sync_flush_timeout_ms",
            "max_message_size",
            "reput_batch_size_bytes",
            "flush_consumer_offset_interval_ms",
            "max_hash_slot_num",
            "max_index_num",
            "max_msgs_num_batch",
            "max_transfer_bytes_on_message_in_memory",
            "max_transfer_count_on_message_in_memory",
            "max_transfer_bytes_on_message_in_disk",
            "max_transfer_count_on_message_in_disk",
            "clean_resource_interval_ms",
        ):
            if getattr(self, name) <= 0:
                raise StoreConfigError(f"{name} must be positive")
        for name in (
            "flush_commit_log_least_pages",
            "flush_consume_queue_least_pages",
            "file_reserved_time_hours",
            "delete_commit_log_files_interval_ms",
            "destroy_mapped_file_interval_forcibly_ms",
        ):
            if getattr(self, name) < 0:
                raise StoreConfigError(f"{name} must not be negative")
        for name in (
            "access_message_in_memory_max_ratio",
            "disk_max_used_space_ratio",
            "disk_space_clean_forcibly_ratio",
            "disk_space_warning_level_ratio",
        ):
            if not 0 <= getattr(self, name) <= 100:
                raise StoreConfigError(f"{name} must be a percentage (0..100)")
        try:
            parse_delete_hours(self.delete_when)
        except ValueError:
            raise StoreConfigError(
                f"delete_when must be hours 00-23 separated by ';', got {self.delete_when!r}"
            ) from None
        host, sep, port = self.store_host.rpartition(":")
        try:
            ipaddress.ip_address(host.strip("[]"))
            valid = bool(sep) and port.isdigit() and 0 <= int(port) < 65536
        except ValueError:
            valid = False
        if not valid:
            raise StoreConfigError(f"store_host must be 'ip:port', got {self.store_host!r}")

    @property
    def delete_hours(self) -> frozenset[int]:
        """The hours of ``delete_when``."""
        return parse_delete_hours(self.delete_when)

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
    def lock_path(self) -> Path:
        return self.store_path_root_dir / "lock"

    @property
    def config_dir(self) -> Path:
        return self.store_path_root_dir / "config"

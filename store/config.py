"""Store configuration: one frozen dataclass, RocketMQ's names in snake_case.

Built once at the process edge and passed down. Units are in the names.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from store.errors import StoreConfigError

#: Bytes of one ConsumeQueue unit: phyOffset(8) + size(4) + tagsCode(8).
CQ_STORE_UNIT_SIZE = 20
#: RocketMQ's default ConsumeQueue file: 300,000 units.
DEFAULT_CQ_UNITS_PER_FILE = 300_000
#: Properties are stored behind a 2-byte signed length.
MAX_PROPERTIES_SIZE = 32767
#: Topic names are stored behind a 1-byte signed length.
MAX_TOPIC_LENGTH = 127


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
            "max_transfer_bytes_on_message_in_memory",
            "max_transfer_count_on_message_in_memory",
            "max_transfer_bytes_on_message_in_disk",
            "max_transfer_count_on_message_in_disk",
        ):
            if getattr(self, name) <= 0:
                raise StoreConfigError(f"{name} must be positive")
        for name in ("flush_commit_log_least_pages", "flush_consume_queue_least_pages"):
            if getattr(self, name) < 0:
                raise StoreConfigError(f"{name} must not be negative")
        if not 0 <= self.access_message_in_memory_max_ratio <= 100:
            raise StoreConfigError("access_message_in_memory_max_ratio must be 0..100")
        host, sep, port = self.store_host.rpartition(":")
        try:
            ipaddress.ip_address(host.strip("[]"))
            valid = bool(sep) and port.isdigit() and 0 <= int(port) < 65536
        except ValueError:
            valid = False
        if not valid:
            raise StoreConfigError(f"store_host must be 'ip:port', got {self.store_host!r}")

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

"""What a send gets back: RocketMQ's PutMessageStatus and PutMessageResult."""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple


class PutStatus(enum.Enum):
    """Outcome of a send (RocketMQ's PutMessageStatus)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class PutMessageResult(NamedTuple):
    """Outcome of a send: one entry per message, in order (a NamedTuple: one is
    built per send, and a frozen dataclass costs a microsecond more to build).

    Only PUT_OK and FLUSH_DISK_TIMEOUT carry offsets: with FLUSH_DISK_TIMEOUT
    the records are written but their fsync did not finish in time.
    """

    status: PutStatus
    detail: str = ""
    physical_offsets: tuple[int, ...] = ()
    queue_offsets: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    store_timestamp_ms: int = 0
    store_host: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK

    @property
    def msg_ids(self) -> list[str]:
        """Offset message ids (store host + physical offset), one per message."""
        # offset_msg_id's hex, computed for the whole send at once: the store
        # host's once, the offsets' in one pack (the per-id formatting was a
        # tenth of a store-node's time on batches of 100).
        n = len(self.physical_offsets)
        host = self.store_host.hex().upper()
        offsets = struct.pack(f">{n}q", *self.physical_offsets).hex().upper()
        return [host + offsets[i : i + 16] for i in range(0, 16 * n, 16)]


def refused(status: PutStatus, detail: str) -> PutMessageResult:
    """A send refused before anything was written."""
    return PutMessageResult(status, detail)

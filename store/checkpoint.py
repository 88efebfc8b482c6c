"""The ``checkpoint`` file: how far each structure is known to be on disk.

::

    offset  size  field
    ------  ----  -----------------------------------------------------------
    0       8     physicMsgTimestamp  store time of the last flushed CommitLog record
    8       8     logicsMsgTimestamp  store time of the last flushed ConsumeQueue entry
    16      8     indexMsgTimestamp   store time of the last flushed IndexFile entry
    24      8     confirmPhyOffset    the confirm offset (controller mode; 0 otherwise)
    32      4064  zero

The file is 4096 bytes (one page) so its update is a single page write.
Abnormal recovery starts from the last CommitLog file whose first record is
older than ``min_timestamp_ms()``. With ``enable_controller_mode``, recovery
dispatches no further than ``confirmPhyOffset`` (see docs/replication.md).
RocketMQ 5 keeps its confirmPhyOffset at byte 32, behind a masterFlushedOffset
Basalt has no use for; Basalt's is at 24, as its replication contract says,
and a file written before it existed reads 0 there.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from pathlib import Path

CHECKPOINT_FILE_SIZE = 4096
#: Safety margin RocketMQ subtracts from the checkpoint minimum.
RECOVERY_MARGIN_MS = 3000

log = logging.getLogger(__name__)

_LAYOUT = struct.Struct(
    ">"
    "q"  # physicMsgTimestamp
    "q"  # logicsMsgTimestamp
    "q"  # indexMsgTimestamp
    "q"  # confirmPhyOffset
)


def size_problem(size: int) -> str | None:
    """Why a checkpoint file of ``size`` bytes is not one, or None (0: just created).
    A start resets such a file to zero timestamps (logged at ERROR); ``basalt store
    check`` reports it."""
    if size in (0, CHECKPOINT_FILE_SIZE):
        return None
    return f"size {size}, expected {CHECKPOINT_FILE_SIZE}"


class StoreCheckpoint:
    """The checkpoint file, mapped; setters are in memory until :meth:`flush`."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        #: The confirm offset (controller mode): written with the next flush().
        self.confirm_phy_offset = 0
        self._fd = -1
        self._mm: mmap.mmap | None = None
        if read_only:
            if path.exists():
                data = path.read_bytes()
                if len(data) >= _LAYOUT.size:
                    self._set_from(data)
            return
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(self._fd).st_size
            problem = size_problem(size)
            if problem is not None:
                # Only a hint: zeros make abnormal recovery start from the first file,
                # the safe (slower) choice, rather than refuse to start.
                log.error(
                    "%s: %s; reset to zero timestamps (recovery after a crash starts "
                    "from the first commitlog file)",
                    path, problem,
                )  # fmt: skip
                os.ftruncate(self._fd, 0)
                size = 0
            if size == 0:
                # Its page reserved now: a store into a hole of a full disk is a SIGBUS.
                os.posix_fallocate(self._fd, 0, CHECKPOINT_FILE_SIZE)
            self._mm = mmap.mmap(self._fd, CHECKPOINT_FILE_SIZE)
        except BaseException:
            os.close(self._fd)
            raise
        self._set_from(self._mm)

    def _set_from(self, data: bytes | mmap.mmap) -> None:
        (
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.confirm_phy_offset,
        ) = _LAYOUT.unpack_from(data, 0)

    def min_timestamp_ms(self) -> int:
        """min(physic, logics) − 3 s, never negative: where abnormal recovery may start."""
        low = min(self.physic_msg_timestamp, self.logics_msg_timestamp) - RECOVERY_MARGIN_MS
        return max(low, 0)

    def min_timestamp_index_ms(self) -> int:
        """Like :meth:`min_timestamp_ms` but also bounded by the index timestamp."""
        return min(self.min_timestamp_ms(), self.index_msg_timestamp)

    def flush(self) -> None:
        """Write the three timestamps and the confirm offset, and fsync."""
        if self._mm is None:
            return
        _LAYOUT.pack_into(
            self._mm,
            0,
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.confirm_phy_offset,
        )
        # fdatasync writes the mapping's dirty page as msync would, and fails the
        # same way; an os call is what a fault injector (tests) can reach.
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._mm is not None:
            self.flush()
            self._mm.close()
            os.close(self._fd)
            self._mm = None

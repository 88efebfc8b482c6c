"""Basalt's storage engine: RocketMQ 4.x's CommitLog/ConsumeQueue layout as a library.

No network imports live here; services are thin adapters around
:class:`basalt.store.message_store.MessageStore`.
"""

from basalt.common.message import Message, MessageRecord
from basalt.store.clock import Clock, ManualClock, SystemClock
from basalt.store.config import FlushDiskType, MessageStoreConfig
from basalt.store.errors import (
    CorruptFileError,
    CorruptRecordError,
    StoreClosedError,
    StoreConfigError,
    StoreError,
    StoreLockedError,
)
from basalt.store.message_store import MessageStore
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.recovery import RecoveryReport

__all__ = [
    "Clock",
    "CorruptFileError",
    "CorruptRecordError",
    "FlushDiskType",
    "ManualClock",
    "Message",
    "MessageRecord",
    "MessageStore",
    "MessageStoreConfig",
    "PutMessageResult",
    "PutStatus",
    "RecoveryReport",
    "StoreClosedError",
    "StoreConfigError",
    "StoreError",
    "StoreLockedError",
    "SystemClock",
]

"""Basalt's storage engine: RocketMQ 4.x's CommitLog/ConsumeQueue layout as a library.

No network imports live here; services are thin adapters around
:class:`store.message_store.MessageStore`.
"""

from store.clock import Clock, ManualClock, SystemClock
from store.config import FlushDiskType, MessageStoreConfig
from store.errors import (
    CorruptFileError,
    CorruptRecordError,
    StoreClosedError,
    StoreConfigError,
    StoreError,
    StoreLockedError,
)
from store.message import Message, MessageRecord
from store.message_store import MessageStore
from store.put_result import PutMessageResult, PutStatus
from store.recovery import RecoveryReport

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

"""What a send must pass before it reaches the CommitLog: RocketMQ's checks in
``DefaultMessageStore.putMessage`` and ``CommitLog.calMsgLength``.

A refused batch gets a PutMessageResult saying why, and nothing is written.
Producer-encoded batches are checked here only as a whole (runs, sizes,
topics, queue ids); their records are checked one by one by the C stamp
(:func:`basalt.common._records.stamp`) under the put lock.
"""

from __future__ import annotations

from collections.abc import Sequence

from basalt.common.message import Message
from basalt.common.record import (
    CRC32_RESERVED_LEN,
    MAX_PROPERTIES_SIZE,
    MAX_TOPIC_LENGTH,
    TOPIC_PATTERN,
    EncodedMessage,
)
from basalt.store.batch import EncodedBatch
from basalt.store.clock import Clock
from basalt.store.commitlog import END_FILE_MIN_BLANK_LENGTH
from basalt.store.config import MessageStoreConfig
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.put_result import refused as _refused
from basalt.store.schedule import BadDelayLevel, park
from basalt.store.timer.park import BadTimer, is_timer_request, park_timer


def _bad_topic(topic: str) -> str:
    return f"topic {topic[:200]!r} is not 1-{MAX_TOPIC_LENGTH} characters of [%|a-zA-Z0-9_-]"


class Admission:
    """Encodes and checks sends for one store. Thread-safe (the topic cache only grows)."""

    def __init__(self, config: MessageStoreConfig, store_host: bytes, clock: Clock) -> None:
        self.config = config
        self.store_host = store_host
        self.clock = clock
        #: Topic names already validated: a regex per message is measurable on the hot path.
        self._valid_topics: set[str] = set()
        #: A batch must fit one CommitLog file, with room for the end-of-file blank.
        self.max_batch_bytes = config.mapped_file_size_commit_log - END_FILE_MIN_BLANK_LENGTH

    def encode(self, messages: Sequence[Message]) -> EncodedBatch | PutMessageResult:
        if not messages:
            return _refused(PutStatus.MESSAGE_ILLEGAL, "empty batch")
        cfg = self.config
        store_host = self.store_host
        now = 0
        append_crc = cfg.enabled_append_prop_crc
        # encoded_properties() ends on a separator: the property is all EncodedMessage adds.
        reserved = CRC32_RESERVED_LEN if append_crc else 0
        encoded: list[EncodedMessage] = []
        delays = cfg.delay_levels_ms
        max_delay_ms = cfg.timer_max_delay_sec * 1000
        for m in messages:
            if m.delay_time_level or m.properties or m.deliver_time_ms:
                # A delayed message is stored parked in SCHEDULE_TOPIC_XXXX (store.schedule).
                try:
                    if is_timer_request(m):
                        # A timer message waits in rmq_sys_wheel_timer (store.timer);
                        # with a delay level too, the level wins (RocketMQ's rule).
                        now = now or self.clock.now_ms()
                        m = park_timer(m, now, max_delay_ms, enabled=cfg.timer_wheel_enable)
                    m = park(m, delays)
                except (BadDelayLevel, BadTimer) as e:
                    return _refused(PutStatus.MESSAGE_ILLEGAL, str(e))
            # Topic names are checked per run by check.
            if m.queue_id < 0 or m.queue_id > 0x7FFFFFFF:
                return _refused(PutStatus.MESSAGE_ILLEGAL, f"queue id {m.queue_id} is out of range")
            if len(m.body) > cfg.max_message_size:
                return _refused(
                    PutStatus.MESSAGE_ILLEGAL,
                    f"body of {len(m.body)} bytes exceeds max_message_size {cfg.max_message_size}",
                )
            props = m.encoded_properties()
            # The CRC32 property counts against PROPLEN, as in RocketMQ's doAppend.
            if len(props) + reserved > MAX_PROPERTIES_SIZE:
                return _refused(
                    PutStatus.PROPERTIES_SIZE_EXCEEDED,
                    f"properties of {len(props) + reserved} bytes exceed {MAX_PROPERTIES_SIZE}",
                )
            born = m.born_timestamp_ms
            if born == 0:
                now = now or self.clock.now_ms()
                born = now
            try:
                em = EncodedMessage(
                    m,
                    store_host=store_host,
                    properties=props,
                    born_timestamp_ms=born,
                    compute_crc=False,  # stamped on append
                    append_crc=append_crc,
                )
            except ValueError as e:
                return _refused(PutStatus.MESSAGE_ILLEGAL, f"bad born host {m.born_host!r}: {e}")
            encoded.append(em)
        return EncodedBatch.of_messages(encoded)

    def check(self, batch: EncodedBatch) -> PutMessageResult | None:
        """Why a batch is refused before its records are looked at; None if it is not."""
        if not batch.runs or not batch.data:
            return _refused(PutStatus.MESSAGE_ILLEGAL, "empty batch")
        if len(batch.data) > self.max_batch_bytes:
            return _refused(
                PutStatus.MESSAGE_ILLEGAL,
                f"batch of {len(batch.data)} bytes does not fit a commitlog file of "
                f"{self.config.mapped_file_size_commit_log} bytes",
            )
        covered = 0
        for run in batch.runs:
            if run.topic not in self._valid_topics and not self._admit_topic(run.topic):
                return _refused(PutStatus.MESSAGE_ILLEGAL, _bad_topic(run.topic))
            if run.queue_id < 0 or run.queue_id > 0x7FFFFFFF:
                return _refused(
                    PutStatus.MESSAGE_ILLEGAL, f"queue id {run.queue_id} is out of range"
                )
            # Runs must tile the data: a byte outside every run would be written
            # without being validated or stamped.
            if run.start != covered or run.end <= run.start:
                return _refused(
                    PutStatus.MESSAGE_ILLEGAL,
                    f"batch runs must cover the data back to back: run at "
                    f"[{run.start}, {run.end}) after byte {covered}",
                )
            covered = run.end
        if covered != len(batch.data):
            return _refused(
                PutStatus.MESSAGE_ILLEGAL,
                f"batch runs cover {covered} of its {len(batch.data)} bytes",
            )
        return None

    def _admit_topic(self, topic: str) -> bool:
        """Validate a topic name not seen before and remember it if it is valid."""
        if len(topic) > MAX_TOPIC_LENGTH or not TOPIC_PATTERN.fullmatch(topic):
            return False
        if len(self._valid_topics) < 100_000:
            self._valid_topics.add(topic)
        return True

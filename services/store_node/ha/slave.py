"""The slave's side of the replication stream (docs/replication.md, "The
stream"): RocketMQ's AutoSwitchHAClient on one ``Replication.Replicate`` call.

One :class:`ReplicationSlave` follows one master address: when the group
state names another master, the integrator closes it and starts a new one
(so a slave never mixes two masters' streams, and the address it dials is
fixed for its life). :meth:`ReplicationSlave.run` connects, says hello,
truncates its log to the consistent point durably *before* its first ack (a
crash can never bring a stale tail back, RocketMQ #10666), then writes
frames byte-identical and acks them, reconnecting with backoff after any
error until :meth:`ReplicationSlave.close`.

Disk work runs off the event loop: truncation, epoch entries and appends on
one dedicated thread (so appends stay in order), flushes through the store's
group commit, state installs in a worker thread. Acks are sent by their own
task: while one is being written, more frames may land, and the next ack
carries the newest offset (acks batch when frames come faster).

Concurrency: every method on the event loop that runs :meth:`run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from basalt.common import dial
from basalt.common.tls import TlsConfig
from basalt.services.store_node.ha.config import ReplicationConfig
from basalt.services.store_node.ha.wire import entries_from_pb, entries_to_pb
from basalt.store import MessageStore
from basalt.store.config import FlushDiskType
from basalt.v1 import replication_pb2 as rpb

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Replication.Replicate, the session's stream.
_REPLICATE = dial.rpc_path(
    rpb.DESCRIPTOR.services_by_name["Replication"].methods_by_name["Replicate"]
)

#: Makes the channel to a master address (default: basalt.common.dial.channel,
#: with the store-node's TLS and credentials).
ChannelFactory = Callable[[str], grpc.aio.Channel]

#: First pause after a failed session; doubles up to the maximum.
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 5.0
#: A master silent for this many heartbeat intervals (and at least the
#: floor) is taken for gone: the slave reconnects.
SILENT_HEARTBEATS = 10
SILENT_FLOOR_S = 2.0


class StreamBroken(Exception):
    """The master sent what this slave must not apply; the session ends and the
    slave connects again."""


class ReplicationSlave:
    """A member following the master at ``master_address``; see the module
    docstring. Read :attr:`connected`, :attr:`master_epoch` and
    :attr:`last_error` for status; the store has the offsets."""

    def __init__(
        self,
        store: MessageStore,
        config: ReplicationConfig,
        broker_name: str,
        broker_id: int,
        master_address: str,
        *,
        channel_factory: ChannelFactory | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.master_address = master_address
        self._channel_factory: ChannelFactory = channel_factory or (
            lambda address: dial.channel(address, tls)
        )
        self._disk = ThreadPoolExecutor(1, thread_name_prefix=f"replica-{broker_name}")
        self._sync_flush = store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        self._closed = asyncio.Event()
        self._session_task: asyncio.Task[None] | None = None
        #: True between a handshake and the end of its session.
        self.connected = False
        #: The epoch of the master's last handshake; 0 before any.
        self.master_epoch = 0
        #: Why the last session ended; None while none has.
        self.last_error: BaseException | None = None
        #: Sessions that reached a handshake.
        self.sessions = 0

    async def run(self) -> None:
        """Follow the master until :meth:`close`: each session ends on an error
        (logged, kept in :attr:`last_error`) and the next starts after a backoff
        (reset by a session that reached its handshake)."""
        backoff = BACKOFF_INITIAL_S
        while not self._closed.is_set():
            sessions = self.sessions
            self._session_task = asyncio.ensure_future(self._session())
            try:
                await self._session_task
            except asyncio.CancelledError:
                if self._closed.is_set():
                    break
                raise
            except Exception as error:  # any failure: reconnect
                self.last_error = error
                log.warning(
                    "%s: replication from %s ended: %s",
                    self.broker_name,
                    self.master_address,
                    error,
                )
            finally:
                self.connected = False
            if self.sessions > sessions:
                backoff = BACKOFF_INITIAL_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._closed.wait()
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def close(self) -> None:
        """Stop following: the session in flight is cancelled and :meth:`run`
        returns; waits for the disk thread's last operation. Idempotent."""
        self._closed.set()
        if self._session_task is not None:
            self._session_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._session_task
        await asyncio.get_running_loop().run_in_executor(None, self._disk.shutdown)

    async def _on_disk(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._disk, fn, *args)

    # -- one session --------------------------------------------------------------------

    async def _session(self) -> None:
        channel = self._channel_factory(self.master_address)
        call: Any = None
        acks: asyncio.Task[None] | None = None
        try:
            call = dial.open_stream(
                channel,
                _REPLICATE,
                rpb.ReplicaRequest.SerializeToString,
                rpb.ReplicaResponse.FromString,
            )
            store = self.store
            await call.write(
                rpb.ReplicaRequest(
                    hello=rpb.ReplicaHello(
                        broker_name=self.broker_name,
                        broker_id=self.broker_id,
                        max_offset=store.max_offset,
                        epochs=entries_to_pb(store.epochs.entries()),
                    )
                )
            )
            first = await self._read(call)
            if not first.HasField("handshake"):
                raise StreamBroken("the master's first message is not a handshake")
            point = await self._truncate_to_consistent_point(first.handshake)
            await call.write(rpb.ReplicaRequest(ack=rpb.ReplicaAck(offset=point)))
            self.connected = True
            self.master_epoch = first.handshake.epoch
            self.sessions += 1
            log.info(
                "%s: slave %d follows master %d (epoch %d) at %s from offset %d",
                self.broker_name,
                self.broker_id,
                first.handshake.master_id,
                first.handshake.epoch,
                self.master_address,
                point,
            )
            written = _Written(point)
            acks = asyncio.ensure_future(self._send_acks(call, written))
            while True:
                message = await self._read(call)
                if acks.done():
                    acks.result()  # its failure ends the session
                kind = message.WhichOneof("kind")
                if kind == "frame":
                    await self._apply_frame(message.frame, written)
                elif kind == "heartbeat":
                    store.set_confirm_offset(message.heartbeat.confirm_offset)
                elif kind == "state":
                    await asyncio.to_thread(
                        store.install_replica_state, message.state.replica_state
                    )
                else:
                    raise StreamBroken(f"unexpected {kind} from the master")
        finally:
            if acks is not None:
                acks.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await acks
            if call is not None:
                call.cancel()
            await channel.close()

    async def _read(self, call: Any) -> rpb.ReplicaResponse:
        """The master's next message; StreamBroken when it hung up or went silent."""
        silent_s = max(
            SILENT_FLOOR_S, SILENT_HEARTBEATS * self.config.ha_heartbeat_interval_ms / 1000
        )
        try:
            async with asyncio.timeout(silent_s):
                message = await call.read()
        except TimeoutError:
            raise StreamBroken(f"the master was silent for {silent_s} s") from None
        if message is grpc.aio.EOF:
            raise StreamBroken("the master ended the stream")
        assert isinstance(message, rpb.ReplicaResponse)
        return message

    async def _truncate_to_consistent_point(self, handshake: rpb.ReplicaHandshake) -> int:
        """Cut this log to where it agrees with the master's, durably, and
        return that offset (the first ack). Raises StreamBroken for a master
        older than this log's last epoch (a deposed one)."""
        store = self.store
        mine = store.epochs.last_epoch()
        if handshake.epoch < mine:
            raise StreamBroken(
                f"the master at {self.master_address} leads epoch {handshake.epoch}, "
                f"older than this log's epoch {mine}"
            )
        my_max = store.max_offset
        point = store.epochs.find_consistent_point(
            entries_from_pb(handshake.epochs), my_max, handshake.max_offset
        )
        if point < 0:
            # No epoch in common: nothing of this log is known to be the
            # group's; copy the master's from its first offset.
            point = handshake.min_offset
            if my_max > 0:
                log.warning(
                    "%s: slave %d shares no epoch with the master: its log (to %d) is cut to %d",
                    self.broker_name,
                    self.broker_id,
                    my_max,
                    point,
                )
        if my_max > point:
            await self._on_disk(store.truncate_to, point)
            log.info(
                "%s: slave %d truncated %d -> %d", self.broker_name, self.broker_id, my_max, point
            )
        else:
            # An epoch this member opened but wrote nothing in (it led a term
            # briefly) starts at the point and is not the master's: left, it
            # would make the master's frames look older than this log.
            await self._on_disk(store.epochs.truncate_from, point)
        if store.max_offset == 0 and point > 0:
            # A new member (an empty log) of a master whose first files expired:
            # it starts at the master's first offset, a file boundary, as
            # RocketMQ's slave starts at the master's last file.
            return point
        return min(point, store.max_offset)

    async def _apply_frame(self, frame: rpb.ReplicaFrame, written: _Written) -> None:
        store = self.store
        last = store.epochs.last_epoch()
        if frame.epoch < last:
            raise StreamBroken(
                f"a frame of epoch {frame.epoch} at offset {frame.offset}: this log is "
                f"at epoch {last} (the master was deposed)"
            )
        if frame.offset != written.offset:
            raise StreamBroken(f"a frame at {frame.offset}, expected one at {written.offset}")
        if frame.epoch > last:
            await self._on_disk(store.epochs.append, frame.epoch, frame.epoch_start_offset)
        written.offset = await self._on_disk(store.append_replicated, frame.offset, frame.data)
        written.changed.set()
        store.set_confirm_offset(frame.confirm_offset)

    async def _send_acks(self, call: Any, written: _Written) -> None:
        """Ack the newest written (or, under SYNC_FLUSH, fsynced) offset each time
        it moves; one ack covers every frame written while the last was sent."""
        acked = written.offset
        while True:
            await written.changed.wait()
            written.changed.clear()
            offset = written.offset
            if self._sync_flush:
                offset = min(offset, await self.store.flush_to_async(offset))
            if offset > acked:
                await call.write(
                    rpb.ReplicaRequest(ack=rpb.ReplicaAck(offset=offset, flushed=self._sync_flush))
                )
                acked = offset


class _Written:
    """Where this session's log ends, and a wake-up for the ack task."""

    __slots__ = ("changed", "offset")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.changed = asyncio.Event()

"""The one module that talks to etcd's client library (aetcd).

:class:`EtcdSession` wraps one ``aetcd.Client`` in a small typed surface
(get, range, put, create-if-absent, compare-and-swap on mod_revision, delete,
multi-compare transactions, leases, watch) and turns the library's errors
into ours: connection refused, deadline exceeded and watch set-up timeouts
become :class:`MetaUnavailableError` naming the endpoints; anything else etcd
refuses becomes :class:`MetaError`.
Nothing outside this module sees an aetcd type.

aetcd quirks handled here:

- It connects to one ``host:port``; with several endpoints the session fails
  over itself, opening a client on the next endpoint when one is unreachable.
- gRPC's default reconnect backoff grows to two minutes; the channel options
  cap it at one second so a restarted etcd is found again promptly.
- A watch stream broken by an etcd restart delivers the error to every watch on
  that client and leaves the client's watch machinery to be rebuilt lazily;
  watchers call :meth:`reset` so each reconnection starts on a fresh channel.
- Its generated protobuf modules register bare file names (``rpc.proto``,
  ``kv.proto``) in protobuf's default pool; Basalt's protos live under
  ``basalt/v1/`` so the names cannot clash.

Concurrency: a session belongs to the event loop that first uses it (the
gRPC channel is bound to it); any number of tasks on that loop may call it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd  # type: ignore[import-untyped]  # ships no type information
import aetcd.rpc  # type: ignore[import-untyped]
import grpc

from basalt.common.tls import TlsConfig
from basalt.services.meta.config import MetaConfig
from basalt.services.meta.errors import MetaError, MetaUnavailableError
from basalt.services.meta.etcd_tls import TlsEtcdClient

log = logging.getLogger(__name__)

R = TypeVar("R")

#: Errors meaning "this endpoint did not answer" (asyncio's TimeoutError is our
#: own safety deadline around a call).
_UNREACHABLE: tuple[type[BaseException], ...] = (
    aetcd.ConnectionFailedError,
    aetcd.ConnectionTimeoutError,
    aetcd.WatchTimeoutError,
    TimeoutError,
)
_CHANNEL_OPTIONS: dict[str, int] = {
    # Find a restarted etcd within about a second instead of gRPC's 2-minute cap.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # Detect a silently dead peer under a long-lived watch stream. etcd's server
    # refuses pings more often than every 5 s (--grpc-keepalive-min-time).
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    # A listing's page of LIST_PAGE_KEYS keys with large values may pass the 4 MiB default.
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
}
#: Keys per page when listing a prefix (:meth:`EtcdSession.get_prefix`): one
#: answer for 20,000 topic configs is ~4.3 MB, past gRPC's 4 MiB message limit.
LIST_PAGE_KEYS = 1000
#: gRPC codes of a Range page meaning "this endpoint did not answer".
_UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
#: Our own deadline is the gRPC deadline plus this, a net under library waits.
_DEADLINE_GRACE_S = 1.0


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    #: Id of the lease the key is bound to; 0 for none.
    lease: int


class EventKind(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: EventKind
    key: str
    #: The new value of a PUT; empty for a DELETE.
    value: bytes
    #: The revision of the change (of the deletion, for a DELETE).
    mod_revision: int


class Target(enum.Enum):
    """What of a key a :class:`Compare` looks at (etcd's Compare.CompareTarget)."""

    VERSION = "VERSION"  # 0: the key does not exist
    CREATE = "CREATE"  # create_revision; 0: the key does not exist
    MOD = "MOD"  # mod_revision
    VALUE = "VALUE"
    LEASE = "LEASE"  # the id of the lease holding the key; 0: none (or no key)


class Op(enum.Enum):
    """How a :class:`Compare` compares (etcd's Compare.CompareResult)."""

    EQUAL = "EQUAL"
    NOT_EQUAL = "NOT_EQUAL"
    GREATER = "GREATER"
    LESS = "LESS"


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a :meth:`EtcdSession.transaction`: ``key``'s ``target`` ``op`` ``value``."""

    key: str
    target: Target
    value: int | bytes
    op: Op = Op.EQUAL

    @classmethod
    def mod_is(cls, key: str, mod_revision: int) -> Compare:
        """``key`` was last written at ``mod_revision`` (0: it does not exist)."""
        return cls(key, Target.MOD, mod_revision)

    @classmethod
    def absent(cls, key: str) -> Compare:
        """``key`` does not exist."""
        return cls(key, Target.VERSION, 0)

    @classmethod
    def present(cls, key: str) -> Compare:
        """``key`` exists."""
        return cls(key, Target.VERSION, 0, Op.GREATER)

    @classmethod
    def leased_by(cls, key: str, lease_id: int) -> Compare:
        """``key`` exists under lease ``lease_id``."""
        return cls(key, Target.LEASE, lease_id)


@dataclass(frozen=True, slots=True)
class Put:
    """A put of a :meth:`EtcdSession.transaction` (under ``lease`` when not 0)."""

    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    """A delete of a :meth:`EtcdSession.transaction`."""

    key: str


_TARGETS = {
    Target.VERSION: ("version", 0),
    Target.CREATE: ("create_revision", 1),
    Target.MOD: ("mod_revision", 2),
    Target.VALUE: ("value", 3),
    Target.LEASE: ("lease", 4),
}
_OPS = {Op.EQUAL: 0, Op.GREATER: 1, Op.LESS: 2, Op.NOT_EQUAL: 3}


def _compare_message(compare: Compare) -> Any:
    field, target = _TARGETS[compare.target]
    if isinstance(compare.value, bytes) != (compare.target is Target.VALUE):
        raise TypeError(f"{compare.target.value} compares a {'bytes' if target == 3 else 'int'}")
    message = aetcd.rpc.Compare(key=compare.key.encode(), target=target, result=_OPS[compare.op])
    setattr(message, field, compare.value)
    return message


def _request_op(op: Put | Delete) -> Any:
    if isinstance(op, Put):
        return aetcd.rpc.RequestOp(
            request_put=aetcd.rpc.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease)
        )
    return aetcd.rpc.RequestOp(
        request_delete_range=aetcd.rpc.DeleteRangeRequest(key=op.key.encode())
    )


def _prefix_end(prefix: bytes) -> bytes:
    """The range end covering every key that starts with ``prefix`` (etcd's
    ``WithPrefix``: the prefix with its last byte below 0xff incremented)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"  # every key
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _kv(raw: Any) -> KeyValue:
    return KeyValue(
        key=bytes(raw.key).decode(),
        value=bytes(raw.value),
        mod_revision=int(raw.mod_revision),
        create_revision=int(raw.create_revision),
        lease=int(raw.lease),
    )


class EtcdSession:
    """One logical connection to the etcd cluster of a :class:`MetaConfig`."""

    def __init__(self, config: MetaConfig, *, tls: TlsConfig | None = None) -> None:
        self.config = config
        #: With TLS enabled, etcd is dialed over TLS (https endpoints).
        self.tls = tls
        self._index = 0
        self._client: Any = None
        #: Clients given up on while other tasks may still be waiting on them,
        #: closed by the ``_retiring`` tasks once those calls have surely timed out.
        self._retired: set[Any] = set()
        self._retiring: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def endpoint(self) -> str:
        """The endpoint in use (or tried next)."""
        return self.config.endpoints[self._index]

    def _current(self) -> Any:
        if self._closed:
            raise MetaError("the etcd session is closed")
        if self._client is None:
            host, _, port = self.endpoint.rpartition(":")
            kwargs: dict[str, Any] = {
                "host": host.strip("[]"),
                "port": int(port),
                "timeout": self.config.op_timeout_s,
                "options": dict(_CHANNEL_OPTIONS),
            }
            if self.tls is not None and self.tls.tls_enable:
                self._client = TlsEtcdClient(tls=self.tls, **kwargs)
            else:
                self._client = aetcd.Client(**kwargs)
        return self._client

    def _fail_over(self, client: Any) -> None:
        """Move to the next endpoint after ``basalt.client`` failed (if it is still current)."""
        if client is not self._client or len(self.config.endpoints) == 1:
            return
        self._index = (self._index + 1) % len(self.config.endpoints)
        self._client = None
        self._retired.add(client)
        delay = self.config.op_timeout_s + _DEADLINE_GRACE_S
        task = asyncio.get_running_loop().create_task(self._close_client(client, delay))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_client(self, client: Any, delay_s: float = 0.0) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        self._retired.discard(client)
        # Closing a client whose stream is already broken can hang or raise in
        # the library; it is ours to drop either way.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.op_timeout_s):
                await client.close()

    async def reset(self) -> None:
        """Drop the current client so the next call opens a fresh channel.

        For a session whose only user is the caller (a watcher): in-flight calls
        on the old client are cancelled.
        """
        client, self._client = self._client, None
        if client is not None:
            await self._close_client(client)

    async def close(self) -> None:
        """Close the client; the session cannot be used afterwards. Idempotent."""
        self._closed = True
        await self.reset()
        for task in list(self._retiring):
            task.cancel()
        self._retiring.clear()
        for client in list(self._retired):
            await self._close_client(client)

    async def _call(self, what: str, op: Callable[[Any], Awaitable[R]]) -> R:
        """Run ``op(client)``, failing over across endpoints; raises MetaUnavailableError
        when none answers and MetaError when etcd refuses the request."""
        last: BaseException = TimeoutError("no endpoint tried")
        for _ in range(len(self.config.endpoints)):
            client = self._current()
            try:
                async with asyncio.timeout(self.config.op_timeout_s + _DEADLINE_GRACE_S):
                    return await op(client)
            except _UNREACHABLE as e:
                last = e
                self._fail_over(client)
            except aetcd.ClientError as e:
                raise MetaError(f"etcd at {self.endpoint} refused {what}: {e}") from e
        raise MetaUnavailableError(self.config.endpoints, what, last)

    # -- key-value -----------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        async def op(c: Any) -> KeyValue | None:
            got = await c.get(key.encode())
            return None if got is None else _kv(got)

        return await self._call(f"get {key}", op)

    async def get_prefix(
        self, prefix: str, *, page_keys: int = LIST_PAGE_KEYS
    ) -> tuple[int, list[KeyValue]]:
        """Every key under ``prefix`` and the store revision the read saw.

        Read in pages of ``page_keys`` keys (etcd's Range ``limit``), each page
        at the first page's revision, so the result is one consistent snapshot
        however large (as Kubernetes lists). A page whose revision was compacted
        meanwhile fails with MetaError; the caller lists again. aetcd has no
        paged range, so the pages are Range calls on its KV stub.
        """
        if page_keys < 1:
            raise ValueError(f"page_keys must be at least 1, not {page_keys}")
        start = prefix.encode()
        end = _prefix_end(start)
        revision = 0
        kvs: list[KeyValue] = []
        while True:
            page = await self._range(
                f"list {prefix}",
                aetcd.rpc.RangeRequest(
                    key=start, range_end=end, limit=page_keys, revision=revision
                ),
            )
            if revision == 0:
                revision = int(page.header.revision)
            kvs.extend(_kv(kv) for kv in page.kvs)
            if not page.more or not page.kvs:
                return revision, kvs
            start = bytes(page.kvs[-1].key) + b"\0"  # the next key after the page's last

    async def latest_mod_revision(self, prefix: str) -> int:
        """The highest mod_revision of a key under ``prefix`` (0: no key): one Range
        of one key, sorted by mod_revision, keys only."""
        start = prefix.encode()
        order = aetcd.rpc.RangeRequest
        got = await self._range(
            f"latest revision of {prefix}",
            aetcd.rpc.RangeRequest(
                key=start,
                range_end=_prefix_end(start),
                limit=1,
                keys_only=True,
                sort_order=order.DESCEND,
                sort_target=order.MOD,
            ),
        )
        return int(got.kvs[0].mod_revision) if got.kvs else 0

    async def _range(self, what: str, request: Any) -> Any:
        """One Range call on aetcd's KV stub (for what aetcd's own API lacks: limits,
        revisions, sorting by revision), its errors turned into ours."""

        async def op(c: Any) -> Any:
            await c.connect()
            try:
                return await c.kvstub.Range(
                    request, timeout=self.config.op_timeout_s, metadata=c.metadata
                )
            except grpc.aio.AioRpcError as e:
                if e.code() in _UNREACHABLE_CODES:
                    raise TimeoutError(e.details()) from e
                raise MetaError(f"etcd at {self.endpoint} refused {what}: {e.details()}") from e

        return await self._call(what, op)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> KeyValue | None:
        """Unconditional put; returns the key's previous value, if it had one."""

        async def op(c: Any) -> KeyValue | None:
            done = await c.put(key.encode(), value, lease=lease or None, prev_kv=True)
            return None if done.prev_kv is None else _kv(done.prev_kv)

        return await self._call(f"put {key}", op)

    async def create(self, key: str, value: bytes) -> bool:
        """Put ``key`` only if it does not exist (create_revision == 0); False if it does."""

        async def op(c: Any) -> bool:
            t = c.transactions
            ok, _ = await c.transaction(
                compare=[t.create(key.encode()) == 0],
                success=[t.put(key.encode(), value)],
                failure=[],
            )
            return bool(ok)

        return await self._call(f"create {key}", op)

    async def compare_and_put(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Put ``key`` only if it was last modified at ``mod_revision``; False otherwise."""

        async def op(c: Any) -> bool:
            t = c.transactions
            ok, _ = await c.transaction(
                compare=[t.mod(key.encode()) == mod_revision],
                success=[t.put(key.encode(), value)],
                failure=[],
            )
            return bool(ok)

        return await self._call(f"update {key}", op)

    async def hold(self, key: str, owner: bytes, lease: int) -> bool:
        """Make ``key`` = ``owner`` under ``lease`` if it is absent or already
        ``owner``'s (re-bound to ``lease``: the owner's lease may have been
        re-granted); False when another owner holds it."""

        async def op(c: Any) -> bool:
            t = c.transactions
            k = key.encode()
            for compare in (t.create(k) == 0, t.value(k) == owner):
                ok, _ = await c.transaction(
                    compare=[compare], success=[t.put(k, owner, lease=lease)], failure=[]
                )
                if ok:
                    return True
            return False

        return await self._call(f"lock {key}", op)

    async def release(self, key: str, owner: bytes) -> bool:
        """Delete ``key`` if ``owner`` holds it; False otherwise."""

        async def op(c: Any) -> bool:
            t = c.transactions
            k = key.encode()
            ok, _ = await c.transaction(
                compare=[t.value(k) == owner], success=[t.delete(k)], failure=[]
            )
            return bool(ok)

        return await self._call(f"unlock {key}", op)

    async def transaction(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> bool:
        """One etcd transaction: if every ``compare`` holds, apply ``success``,
        else ``failure``, atomically. Returns whether the compares held.

        etcd checks the leases of the puts of the branch taken only: a put under
        a lease that has ended raises MetaError, so guard such a put with
        :meth:`Compare.leased_by` on a key of the same lease (an ended lease has
        taken its keys with it, and the compare fails instead).
        """
        what = "transaction on " + ", ".join(sorted({c.key for c in compare}) or ["nothing"])
        request = aetcd.rpc.TxnRequest(
            compare=[_compare_message(c) for c in compare],
            success=[_request_op(op) for op in success],
            failure=[_request_op(op) for op in failure],
        )

        async def op(c: Any) -> bool:
            await c.connect()
            try:
                reply = await c.kvstub.Txn(
                    request, timeout=self.config.op_timeout_s, metadata=c.metadata
                )
            except grpc.aio.AioRpcError as e:
                if e.code() in _UNREACHABLE_CODES:
                    raise TimeoutError(e.details()) from e
                raise MetaError(f"etcd at {self.endpoint} refused {what}: {e.details()}") from e
            return bool(reply.succeeded)

        return await self._call(what, op)

    async def delete(self, key: str) -> bool:
        """Delete ``key``; False if it did not exist."""

        async def op(c: Any) -> bool:
            return await c.delete(key.encode()) is not None

        return await self._call(f"delete {key}", op)

    # -- leases ----------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; returns its id."""

        async def op(c: Any) -> int:
            return int((await c.lease(ttl_s)).id)

        return await self._call("grant lease", op)

    async def keepalive(self, lease_id: int) -> int:
        """Refresh a lease; returns its TTL, 0 when etcd no longer knows it (expired)."""

        async def op(c: Any) -> int:
            reply = await c.refresh_lease(lease_id)
            if reply is None:  # the keepalive stream closed without an answer
                raise aetcd.ConnectionFailedError("lease keepalive stream closed")
            return int(reply.TTL)

        return await self._call(f"keep lease {lease_id:x} alive", op)

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease, deleting every key bound to it."""

        async def op(c: Any) -> None:
            await c.revoke_lease(lease_id)

        await self._call(f"revoke lease {lease_id:x}", op)

    # -- watch -----------------------------------------------------------------------

    async def watch_prefix(
        self, prefix: str, start_revision: int
    ) -> AsyncGenerator[WatchEvent, None]:
        """Every change under ``prefix`` from ``start_revision`` on, in revision order.

        Ends only by raising: MetaUnavailableError when the stream breaks (etcd
        down, or the revision compacted away — either way re-list and re-watch).
        """

        async def op(c: Any) -> Any:
            return await c.watch_prefix(prefix.encode(), start_revision=start_revision)

        watch = await self._call(f"watch {prefix}", op)
        try:
            async for event in watch:
                yield WatchEvent(
                    kind=EventKind(str(event.kind)),
                    key=bytes(event.kv.key).decode(),
                    value=bytes(event.kv.value),
                    mod_revision=int(event.kv.mod_revision),
                )
        except _UNREACHABLE as e:
            raise MetaUnavailableError(self.config.endpoints, f"watch {prefix}", e) from e
        except aetcd.ClientError as e:  # e.g. RevisionCompactedError
            raise MetaUnavailableError(self.config.endpoints, f"watch {prefix}", e) from e
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.config.op_timeout_s):
                    await watch.cancel()
        # The library ends the iteration when its client is closed.
        raise MetaUnavailableError(
            self.config.endpoints, f"watch {prefix}", ConnectionError("watch stream closed")
        )

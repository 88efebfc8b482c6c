"""What every SDK client shares: its pull-service, one channel per address."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Self

import grpc

from basalt.common import dial
from basalt.common import tls as transport
from basalt.common.auth import Credentials
from basalt.v1 import pull_service_pb2_grpc as ps_grpc

#: Room for a batch of large records either way (gRPC's default is 4 MiB).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class Client:
    """A client of one pull-service (``endpoints``) that also reaches store-nodes;
    ``async with`` it, or :meth:`start` / :meth:`close`. Channels are made on
    first use, one per address, and belong to the event loop that made them.
    With ``tls`` enabled every channel is TLS (its CA trusted, its certificate
    presented to a cluster that requires one: basalt.common.tls). With
    ``credentials`` every call is signed (a cluster with auth on,
    docs/security.md); without, calls go unsigned."""

    def __init__(
        self,
        endpoints: str,
        *,
        tls: transport.TlsConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.tls = tls
        self.credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._pull: ps_grpc.PullServiceAsyncStub | None = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self._pull = ps_grpc.PullServiceStub(self._channel(self.endpoints))

    async def close(self) -> None:
        """Close every channel (subclasses finish their own work first)."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    def _pull_service(self) -> ps_grpc.PullServiceAsyncStub:
        if self._pull is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._pull

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = dial.channel(
                address,
                self.tls,
                credentials=self.credentials,
                options=(
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ),
            )
        return channel


async def finish_requests(call: grpc.aio.StreamStreamCall[Any, Any]) -> None:
    """Half-close ``call`` once it has ended (or to end it), quietly.

    A stream call made through interceptors (the signing ones) feeds its
    writes to gRPC through a task of gRPC's own, which gRPC cancels only when
    the call is cancelled before it ends: a call the peer or the connection
    ended leaves that task waiting for the next write forever, and asyncio
    reports it "destroyed but pending" once the call is garbage. Half-closing
    the ended call ends that task."""
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
        await call.done_writing()

"""The consumer's side of a pull-service Session, spoken over the raw stub."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpc

from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc


class Consumer:
    """A consumer's side of a Session: opens it, heartbeats, answers commands."""

    def __init__(
        self,
        stub: ps_grpc.PullServiceAsyncStub,
        client_id: str,
        *,
        group: str = "G",
        answer: Callable[[ps.Command], tuple[bool, str] | None] = lambda c: (True, "done"),
        heartbeat: bool = True,
    ) -> None:
        self.stub = stub
        self.group = group
        self.client_id = client_id
        self.answer = answer
        self.heartbeat = heartbeat
        self.commands: list[ps.Command] = []
        self.rebalances: list[ps.Command] = []
        self.call: Any = None
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self.ended: asyncio.Future[grpc.aio.AioRpcError | None] = asyncio.Future()

    async def open(self, *subscriptions: pb.TopicSubscription) -> ps.SessionOpened:
        self.call = self.stub.Session()
        await self._write(
            ps.SessionRequest(
                open=ps.OpenSession(
                    group=self.group,
                    client_id=self.client_id,
                    subscriptions=subscriptions,
                    client_version="basalt-test 0.1",
                )
            )
        )
        first: ps.SessionResponse = await self.call.read()
        assert first.WhichOneof("frame") == "opened", first
        self._tasks.append(asyncio.ensure_future(self._read()))
        if self.heartbeat:
            self._tasks.append(asyncio.ensure_future(self._beat(first.opened)))
        return first.opened

    async def _write(self, frame: ps.SessionRequest) -> None:
        async with self._lock:  # one write at a time on a stream
            await self.call.write(frame)

    async def _beat(self, opened: ps.SessionOpened) -> None:
        with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
            while True:  # until the service ends the stream
                await asyncio.sleep(opened.heartbeat_interval_ms / 1000 / 2)
                await self._write(ps.SessionRequest(heartbeat=ps.Heartbeat()))

    async def _read(self) -> None:
        try:
            while True:
                frame = await self.call.read()
                if frame is grpc.aio.EOF:
                    self.ended.set_result(None)
                    return
                command = frame.command
                if "-rebalance-" in command.command_id:
                    # The service's own push on a membership change: counted
                    # apart, so a test's commands are the ones it sent.
                    self.rebalances.append(command)
                    answer: tuple[bool, str] | None = (True, "rebalanced")
                else:
                    self.commands.append(command)
                    answer = self.answer(command)
                if answer is not None:
                    ok, detail = answer
                    ack = ps.CommandAck(command_id=command.command_id, ok=ok, detail=detail)
                    with contextlib.suppress(asyncio.InvalidStateError):  # ended meanwhile
                        await self._write(ps.SessionRequest(ack=ack))
        except grpc.aio.AioRpcError as e:
            self.ended.set_result(e)

    async def close(self) -> None:
        """Half-close, as a consumer shutting down does; the service ends the stream."""
        await self.call.done_writing()
        await asyncio.wait_for(asyncio.shield(self.ended), 10)
        await self._stop()

    async def cancel(self) -> None:
        """Vanish without a word (a killed consumer's connection drops)."""
        self.call.cancel()
        await self._stop()

    async def _stop(self) -> None:
        # Wait for the tasks too: a call left in flight when the test's event
        # loop closes makes grpc's poller call into the closed loop.
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

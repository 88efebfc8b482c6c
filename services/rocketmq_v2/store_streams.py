"""The front's sends to the store-nodes: one ``StoreNode.SendStream`` per store-node.

A unary ``SendBatch`` per joined request cost the pull-service and the
store-node a gRPC call each (benchmarks/rocketmq_v2.py: the outgoing calls
were about a quarter of the front's CPU). :class:`SendStreams` keeps one
long-lived stream per store-node address, as Basalt's SDK does: each
:meth:`SendStreams.send` writes its batches (one per queue) as one stream
message, each with an ``opaque`` of its own, and waits for their answers.

A stream that ends or fails (the store-node stopped, the channel broke)
fails every send waiting on it with INTERNAL_SERVER_ERROR and is forgotten;
the next send opens a new one. A send whose answers do not come within its
timeout fails the same way (its batches may still be stored: the client
retries with the same message ids). One event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import grpc

from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.services.rocketmq_v2.conversions import V2Error, code_of_response
from basalt.v1 import store_node_pb2 as sn


class _Stream:
    """One open SendStream: its call, the answers awaited by opaque, its reader."""

    def __init__(self, call: Any, peer: str) -> None:
        self.call = call
        self.peer = peer
        self.waiting: dict[int, asyncio.Future[sn.SendStreamAnswer]] = {}
        self.broken: V2Error | None = None
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                for answer in response.answers:
                    waiting = self.waiting.pop(answer.opaque, None)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(answer)
            why = "ended"
        except grpc.aio.AioRpcError as e:
            why = f"failed: {e.code().name} {e.details() or ''}".rstrip()
        except asyncio.CancelledError:
            why = "closed"
        self.broken = V2Error(v2.INTERNAL_SERVER_ERROR, f"{self.peer}: send stream {why}")
        for waiting in self.waiting.values():
            if not waiting.done():
                waiting.set_exception(self.broken)
        self.waiting.clear()


class SendStreams:
    """One SendStream per store-node address (module docstring).
    ``open_stream(address)``: a new SendStream call to that store-node (the
    pull-service's channels')."""

    def __init__(self, open_stream: Callable[[str], Any]) -> None:
        self._open_stream = open_stream
        self._streams: dict[str, _Stream] = {}
        self._opaques = itertools.count(1)

    def _stream(self, address: str, peer: str) -> _Stream:
        stream = self._streams.get(address)
        if stream is None or stream.broken is not None:
            stream = _Stream(self._open_stream(address), peer)
            self._streams[address] = stream
        return stream

    async def send(
        self, address: str, peer: str, batches: list[sn.SendBatchRequest], timeout_s: float
    ) -> list[sn.SendStreamAnswer]:
        """Write ``batches`` on ``address``'s stream as one message; their
        answers, in order (each a ``result`` or a ``refused``). V2Error
        INTERNAL_SERVER_ERROR when the stream fails or the answers do not
        come within ``timeout_s``."""
        stream = self._stream(address, peer)
        loop = asyncio.get_running_loop()
        opaques = [next(self._opaques) for _ in batches]
        answers = [loop.create_future() for _ in batches]
        stream.waiting.update(zip(opaques, answers, strict=True))
        request = sn.SendStreamRequest(
            items=[
                sn.SendStreamItem(opaque=o, batch=b) for o, b in zip(opaques, batches, strict=True)
            ]
        )
        try:
            await stream.call.write(request)
            async with asyncio.timeout(timeout_s):
                return list(await asyncio.gather(*answers))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
            raise V2Error(v2.INTERNAL_SERVER_ERROR, f"{peer}: send stream failed: {e}") from None
        except TimeoutError:
            raise V2Error(
                v2.INTERNAL_SERVER_ERROR, f"{peer} did not answer within {timeout_s:.1f} s"
            ) from None
        finally:
            for o in opaques:
                stream.waiting.pop(o, None)

    async def close(self) -> None:
        """End every stream (the front stops)."""
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.call.cancel()
            stream.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream.reader


def refused(answer: sn.SendStreamAnswer, peer: str) -> V2Error | None:
    """The store-node's refusal of one batch in v2 terms; None when stored."""
    if answer.HasField("result"):
        return None
    r = answer.refused
    return V2Error(code_of_response(r.code), f"{peer}: {r.message}")

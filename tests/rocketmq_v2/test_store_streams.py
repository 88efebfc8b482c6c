"""basalt.services.rocketmq_v2.store_streams: one SendStream per store-node, answers by opaque."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.services.rocketmq_v2.conversions import V2Error
from basalt.services.rocketmq_v2.store_streams import SendStreams, refused
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn


class FakeCall:
    """A SendStream call: answers each written item (offsets from 0 per call,
    refuses topic "no"), in reverse order; ``end()`` ends the stream."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[sn.SendStreamResponse | None] = asyncio.Queue()
        self.written: list[sn.SendStreamRequest] = []
        self.silent = False

    async def write(self, request: sn.SendStreamRequest) -> None:
        self.written.append(request)
        if self.silent:
            return
        answers = []
        for item in reversed(request.items):
            if item.batch.topic == "no":
                answers.append(
                    sn.SendStreamAnswer(
                        opaque=item.opaque,
                        refused=pb.Refused(code=pb.RESPONSE_CODE_NO_PERMISSION, message="perm"),
                    )
                )
            else:
                result = pb.SendResult(status=pb.SEND_STATUS_SEND_OK, queue_offsets=[item.opaque])
                answers.append(sn.SendStreamAnswer(opaque=item.opaque, result=result))
        await self.answers.put(sn.SendStreamResponse(answers=answers))

    def end(self) -> None:
        self.answers.put_nowait(None)

    def cancel(self) -> None:
        self.end()

    def __aiter__(self) -> AsyncIterator[sn.SendStreamResponse]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[sn.SendStreamResponse]:
        while (response := await self.answers.get()) is not None:
            yield response


class FakeStub:
    def __init__(self) -> None:
        self.calls: list[FakeCall] = []

    def SendStream(self) -> FakeCall:  # the gRPC method's name
        self.calls.append(FakeCall())
        return self.calls[-1]


def _batch(topic: str) -> sn.SendBatchRequest:
    return sn.SendBatchRequest(topic=topic, queue_id=0, records=b"")


def test_answers_come_back_in_order_and_one_stream_is_reused() -> None:
    async def main() -> None:
        stub = FakeStub()
        streams = SendStreams(lambda address: stub.SendStream())
        answers = await streams.send("a:1", "peer", [_batch("t"), _batch("no")], 5)
        assert [refused(a, "peer") is None for a in answers] == [True, False]
        refusal = refused(answers[1], "peer")
        assert refusal is not None and refusal.status().code == v2.FORBIDDEN
        first = answers[0].result.queue_offsets[0]
        again = await streams.send("a:1", "peer", [_batch("t")], 5)
        assert again[0].result.queue_offsets[0] > first
        assert len(stub.calls) == 1  # the same stream
        await streams.close()

    asyncio.run(main())


def test_a_broken_stream_fails_its_waiters_and_the_next_send_reopens() -> None:
    async def main() -> None:
        stub = FakeStub()
        streams = SendStreams(lambda address: stub.SendStream())
        await streams.send("a:1", "peer", [_batch("t")], 5)
        stub.calls[0].silent = True
        waiting = asyncio.create_task(streams.send("a:1", "peer", [_batch("t")], 5))
        await asyncio.sleep(0.01)
        stub.calls[0].end()
        with pytest.raises(V2Error, match="send stream ended"):
            await waiting
        answers = await streams.send("a:1", "peer", [_batch("t")], 5)
        assert refused(answers[0], "peer") is None
        assert len(stub.calls) == 2
        stub.calls[1].silent = True
        with pytest.raises(V2Error, match="did not answer"):
            await streams.send("a:1", "peer", [_batch("t")], 0.05)
        await streams.close()

    asyncio.run(main())

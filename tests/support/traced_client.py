"""An application of the SDK that traces: a producer and a push consumer in one
process which sets up OpenTelemetry as an application does
(:func:`basalt.common.telemetry.setup_telemetry`, exporters from its ``OTEL_*``
environment).

Run as a program: ``python -m tests.support.traced_client ENDPOINT GROUP TOPIC``.
It sends one message to TOPIC (its ``send TOPIC`` span; the first send also
creates the topic), then consumes TOPIC from the first offset as GROUP (the
``process TOPIC`` span links to the send span) and prints ``consumed`` once
the listener has had the message. It stays a live member of GROUP (a
``resetOffsetByTime`` reaches it: ``handle reset_offset``) until SIGTERM,
when it closes the consumer and the producer and flushes its spans
(:meth:`~basalt.common.telemetry.Telemetry.shutdown`) before it exits 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from basalt.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageQueue,
    MessageRecord,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from basalt.common.telemetry import TelemetryConfig, setup_telemetry

#: The resource's service.name of this process's spans.
SERVICE_NAME = "basalt-test-client"


async def main(endpoint: str, group: str, topic: str) -> None:
    telemetry = setup_telemetry(TelemetryConfig(service_name=SERVICE_NAME, log_level="WARNING"))
    consumed = asyncio.Event()

    def listener(messages: list[MessageRecord], queue: MessageQueue) -> ConsumeStatus:
        consumed.set()
        return ConsumeStatus.CONSUME_SUCCESS

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        async with Producer(endpoint, group=f"{group}-producer") as producer:
            result = await producer.send(Message(topic=topic, body=b"traced"))
            assert result.ok, result
            consumer = PushConsumer(
                endpoint,
                config=PushConsumerConfig(
                    consumer_group=group,
                    consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                    broker_suspend_max_time_ms=1000,
                ),
                listener=listener,
            )
            consumer.subscribe(topic)
            async with consumer:
                await consumed.wait()
                print("consumed", flush=True)
                await stop.wait()
    finally:
        telemetry.shutdown()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

"""``cluster.healthy``, the poll that ``cluster up`` and the restart benchmarks wait on."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from basalt.services.cluster.etcd import free_port
from basalt.services.cluster.local import healthy


def test_a_server_that_starts_after_a_refused_poll_is_seen_by_the_next_poll() -> None:
    """A refused connection must not delay the next poll: gRPC shares a
    subchannel between the channels a process has open to one address, and
    with it the refusal's reconnect backoff (about a second), so a restart
    looked seconds slower than it was. Here another channel to the address
    (a client's, as in the benchmark) keeps that subchannel alive."""

    async def scenario() -> tuple[bool, bool]:
        address = f"127.0.0.1:{free_port()}"
        async with grpc.aio.insecure_channel(address) as client:
            client.get_state(try_to_connect=True)
            before = await healthy(address)  # nothing listens yet: refused
            server = grpc.aio.server()
            health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
            server.add_insecure_port(address)
            await server.start()
            try:
                return before, await healthy(address)
            finally:
                await server.stop(None)

    before, after = asyncio.run(scenario())
    assert not before
    assert after

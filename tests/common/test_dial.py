"""basalt.common.dial.channel and sync_channel, Basalt's one channel factory,
sign every call: with the credentials given, else the process's, else not at
all; never when told not to (etcd's channel: etcd reads ``authorization`` as
its own token). A loopback server records what arrives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import grpc

from basalt.common import auth, dial
from tests.support.aio import async_test

METHOD = "/test.Echo/Call"
STREAM = "/test.Echo/Stream"
ALICE = auth.Credentials("alice", "alice-secret")
SERVICE = auth.Credentials("internal", "internal-secret")


@asynccontextmanager
async def recording_server() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A plaintext server answering METHOD; yields its address and the metadata
    of every call it took, in order."""
    seen: list[dict[str, str]] = []

    async def call(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        seen.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        return request

    async def stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        seen.append({k: str(v) for k, v in context.invocation_metadata() or ()})
        async for request in requests:
            await context.write(request)

    handlers = {
        "Call": grpc.unary_unary_rpc_method_handler(call),
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", seen
    finally:
        await server.stop(0)


@contextmanager
def process_credentials(credentials: auth.Credentials | None) -> Iterator[None]:
    before = auth.process_credentials()
    auth.use_process_credentials(credentials)
    try:
        yield
    finally:
        auth.use_process_credentials(before)


def _signer(metadata: dict[str, str]) -> str | None:
    """The access key a call was signed with, checked against its date-time."""
    if auth.AUTHORIZATION not in metadata:
        return None
    parsed = auth.parse_authorization(metadata[auth.AUTHORIZATION])
    secret = {ALICE.access_key: ALICE.secret_key, SERVICE.access_key: SERVICE.secret_key}
    expected = auth.sign(secret[parsed.access_key], metadata[auth.DATE_TIME])
    assert parsed.signature.lower() == expected
    return parsed.access_key


async def _call_async(address: str, credentials: auth.Credentials | None) -> None:
    async with dial.channel(address, credentials=credentials) as channel:
        assert await channel.unary_unary(METHOD)(b"x") == b"x"


def _call_sync(address: str, credentials: auth.Credentials | None) -> None:
    with dial.sync_channel(address, credentials=credentials) as channel:
        assert channel.unary_unary(METHOD)(b"x", timeout=5) == b"x"


@async_test
async def test_both_channels_sign_with_their_own_then_the_processs_credentials() -> None:
    async with recording_server() as (address, seen):
        with process_credentials(None):
            await _call_async(address, None)
            await asyncio.to_thread(_call_sync, address, None)
        with process_credentials(SERVICE):
            await _call_async(address, ALICE)
            await asyncio.to_thread(_call_sync, address, ALICE)
            await _call_async(address, None)
            await asyncio.to_thread(_call_sync, address, None)
            async with dial.channel(address, credentials=ALICE, signed=False) as etcd_like:
                await etcd_like.unary_unary(METHOD)(b"x")
    signers = [_signer(m) for m in seen]
    assert signers == [None, None, "alice", "alice", "internal", "internal", None]


@async_test
async def test_a_stream_is_signed_as_its_channels_calls_and_written_to_directly() -> None:
    """open_stream signs with the channel's credentials (given, else the
    process's; never on an unsigned channel) and returns grpc.aio's own call:
    no interceptor's queue and task between a write and the call."""
    async with recording_server() as (address, seen):
        with process_credentials(SERVICE):
            for credentials, signed in ((ALICE, True), (None, True), (ALICE, False)):
                async with dial.channel(address, credentials=credentials, signed=signed) as channel:
                    call = dial.open_stream(channel, STREAM, None, None)
                    assert type(call).__name__ == "StreamStreamCall"
                    await call.write(b"a")
                    assert await call.read() == b"a"
                    await call.done_writing()
                    assert await call.code() is grpc.StatusCode.OK
    assert [_signer(m) for m in seen] == ["alice", "internal", None]


def test_credentials_from_env_reads_the_named_file(tmp_path: Path) -> None:
    assert auth.credentials_from_env({}) is None
    ALICE.to_file(tmp_path / "alice.json")
    named = {auth.CREDENTIALS_ENV: str(tmp_path / "alice.json")}
    assert auth.credentials_from_env(named) == ALICE

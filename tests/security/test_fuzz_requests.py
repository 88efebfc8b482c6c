"""Malformed and oversized requests to every RPC of both protocols, against a
real cluster (``basalt cluster up --auth``: etcd, a store-node, the
pull-service with its v2 front, the admin service), signed as the admin user
so that each request reaches its servicer.

Every method of every service is taken from the service descriptors (a new
RPC is fuzzed without a change here) and sent, with a fixed seed: random
bytes (refused INVALID_ARGUMENT "does not parse" exactly when protobuf
cannot decode them), and requests whose every field is oversized or absurd
(70,000-character strings, 2^62 integers, unknown enum values, Durations and
Timestamps out of range or with negative nanos). Every answer must be OK or a
refusal status of the documented tables (docs/architecture.md#errors,
docs/rocketmq-v2.md#status-codes) - never UNKNOWN or INTERNAL, never a v2
INTERNAL_ERROR, never Python internals in the message - and the processes
must serve normally afterwards. Then the cases issue 28 found, one by one,
with the status each must get.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc

from basalt.common import auth
from basalt.common.local_cluster import LOCAL_CREDENTIALS
from basalt.common.receipt import ReceiptHandle
from basalt.common.status import RESPONSE_CODE_KEY
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.v1 import admin_pb2 as adm
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.processes import local_cluster, run_basalt_sync

TOPIC = "FuzzTopic"
SEED = 28
#: Random payloads per method, and their lengths.
RANDOM_LENGTHS = (1, 9, 64, 700)
#: A call's deadline: held calls (long polls) end by it.
CALL_TIMEOUT_S = 3.0
#: The whole sweep's bound.
SWEEP_BUDGET_S = 240.0
#: Refusal statuses of the documented tables (and UNIMPLEMENTED for a v2
#: method the front does not serve; DEADLINE_EXCEEDED for a held call).
ALLOWED = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
#: Never in a message: Python internals.
INTERNALS = ("Traceback", "<class", "struct.error", "Unexpected ")
#: v2 codes a fuzzed request must never get (all store-nodes are up).
V2_FORBIDDEN = frozenset({v2.INTERNAL_ERROR, v2.INTERNAL_SERVER_ERROR})


@dataclass(frozen=True)
class Cluster:
    data: Path
    addresses: dict[str, str]  # service full name -> address

    def metadata(self) -> tuple[tuple[str, str], ...]:
        creds = auth.Credentials.from_file(self.data / LOCAL_CREDENTIALS)
        return auth.signed_metadata(creds, time.time())


SERVICES: tuple[ServiceDescriptor, ...] = (
    sn.DESCRIPTOR.services_by_name["StoreNode"],
    ps.DESCRIPTOR.services_by_name["PullService"],
    adm.DESCRIPTOR.services_by_name["Admin"],
    sv.DESCRIPTOR.services_by_name["MessagingService"],
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data = tmp_path_factory.mktemp("fuzz") / ".basalt"
    with local_cluster(data, "--store-nodes", "1", "--auth") as rows:
        by_role = {r["role"]: r for r in rows}
        addresses = {
            SERVICES[0].full_name: by_role["store-node"]["address"],
            SERVICES[1].full_name: by_role["pull-service"]["address"],
            SERVICES[2].full_name: by_role["admin"]["address"],
            SERVICES[3].full_name: by_role["pull-service"]["rocketmq_v2"],
        }
        made = run_basalt_sync(
            "admin", "updateTopic", "-t", TOPIC, "-r", "2", "-w", "2", "-b", "broker-a",
            "--server", by_role["admin"]["address"],
            "--credentials", str(data / LOCAL_CREDENTIALS),
        )  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr
        yield Cluster(data, addresses)


# -- requests ------------------------------------------------------------------------------

_BIG = 2**62
_INTS = {
    FieldDescriptor.TYPE_INT32: 2**31 - 1,
    FieldDescriptor.TYPE_SINT32: -(2**31),
    FieldDescriptor.TYPE_SFIXED32: 2**31 - 1,
    FieldDescriptor.TYPE_UINT32: 2**32 - 1,
    FieldDescriptor.TYPE_FIXED32: 2**32 - 1,
    FieldDescriptor.TYPE_INT64: _BIG,
    FieldDescriptor.TYPE_SINT64: -_BIG,
    FieldDescriptor.TYPE_SFIXED64: _BIG,
    FieldDescriptor.TYPE_UINT64: 2**64 - 1,
    FieldDescriptor.TYPE_FIXED64: 2**64 - 1,
}


def _value(field: FieldDescriptor, size: int) -> Any:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return "x" * size
    if t == FieldDescriptor.TYPE_BYTES:
        return b"\xff" * size
    if t == FieldDescriptor.TYPE_BOOL:
        return True
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 1e30
    if t == FieldDescriptor.TYPE_ENUM:
        return 2**31 - 1  # a value no enum names (proto3 keeps it)
    return _INTS[t]


def _fill(message: Message, size: int, depth: int = 0) -> None:
    """Every field of ``message`` oversized or absurd (module docstring)."""
    name = message.DESCRIPTOR.full_name
    if name in ("google.protobuf.Duration", "google.protobuf.Timestamp"):
        message.seconds = _BIG  # type: ignore[attr-defined]
        message.nanos = -1  # type: ignore[attr-defined]
        return
    for field in message.DESCRIPTOR.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            target = getattr(message, field.name)
            for i in range(200):
                key: Any = f"k{i}" if field.message_type.fields_by_name["key"].type == 9 else i
                if value_field.message_type is not None:
                    if depth < 2:
                        _fill(target[key], 16, depth + 1)
                else:
                    target[key] = _value(value_field, 16)
        elif field.is_repeated:
            target = getattr(message, field.name)
            for _ in range(3 if field.message_type is not None else 500):
                if field.message_type is not None:
                    if depth < 2:
                        _fill(target.add(), size, depth + 1)
                else:
                    target.append(_value(field, 16))
        elif field.message_type is not None:
            if depth < 3:
                _fill(getattr(message, field.name), size, depth + 1)
        else:
            setattr(message, field.name, _value(field, size))


def _oversized(method: MethodDescriptor, size: int) -> bytes:
    request = GetMessageClass(method.input_type)()
    _fill(request, size)
    return request.SerializeToString()


def _parses(method: MethodDescriptor, raw: bytes) -> bool:
    try:
        GetMessageClass(method.input_type).FromString(raw)
        return True
    except (DecodeError, RuntimeWarning, ValueError):
        return False


# -- calls ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    details: str
    responses: list[bytes]
    #: A refusal: it carries a basalt-response-code.
    refused: bool = False


async def _call(
    channel: grpc.aio.Channel, service: str, method: MethodDescriptor, raw: bytes, md: Any
) -> Answer:
    path = f"/{service}/{method.name}"
    try:
        if method.client_streaming:
            call: Any = (
                channel.stream_stream(path)
                if method.server_streaming
                else channel.stream_unary(path)
            )
            answer = call(iter([raw]), timeout=CALL_TIMEOUT_S, metadata=md)
        else:
            call = (
                channel.unary_stream(path) if method.server_streaming else channel.unary_unary(path)
            )
            answer = call(raw, timeout=CALL_TIMEOUT_S, metadata=md)
        responses = [r async for r in answer] if method.server_streaming else [await answer]
        return Answer(grpc.StatusCode.OK, "", responses)
    except grpc.aio.AioRpcError as e:
        trailers = dict(e.trailing_metadata() or ())
        return Answer(e.code(), e.details() or "", [], RESPONSE_CODE_KEY in trailers)


def _v2_codes(method: MethodDescriptor, answer: Answer) -> list[int]:
    """The v2 Status codes in a v2 method's answers."""
    out_class = GetMessageClass(method.output_type)
    codes = []
    for raw in answer.responses:
        response = out_class.FromString(raw)
        if "status" in response.DESCRIPTOR.fields_by_name and response.HasField("status"):
            codes.append(response.status.code)
    return codes


def _check(where: str, service: ServiceDescriptor, method: MethodDescriptor, answer: Answer) -> str:
    """'' when ``answer`` is one the tables document, else what is wrong."""
    # UNAVAILABLE is a refusal (BROKER_NOT_EXIST: a request naming an unknown
    # broker) when it carries a response code; without one, a process is down.
    if answer.code not in ALLOWED and not (
        answer.code is grpc.StatusCode.UNAVAILABLE and answer.refused
    ):
        return f"{where}: {answer.code.name} {answer.details[:200]!r}"
    if any(s in answer.details for s in INTERNALS):
        return f"{where}: Python internals in {answer.details[:200]!r}"
    if service.full_name == SERVICES[3].full_name:
        bad = [c for c in _v2_codes(method, answer) if c in V2_FORBIDDEN]
        if bad:
            return f"{where}: v2 {v2.Code.Name(bad[0])}"
    return ""


@async_test(timeout_s=SWEEP_BUDGET_S + 120)
async def test_every_rpc_answers_random_and_oversized_requests_by_the_tables(
    cluster: Cluster,
) -> None:
    rng = random.Random(SEED)
    problems: list[str] = []
    calls = unparsed = 0
    loop_start = time.monotonic()
    for service in SERVICES:
        async with grpc.aio.insecure_channel(cluster.addresses[service.full_name]) as channel:
            for method in service.methods:
                md = cluster.metadata()
                payloads = [rng.randbytes(n) for n in RANDOM_LENGTHS]
                payloads += [_oversized(method, 70_000), _oversized(method, 8)]
                for k, raw in enumerate(payloads):
                    assert time.monotonic() - loop_start < SWEEP_BUDGET_S, "sweep too slow"
                    answer = await _call(channel, service.full_name, method, raw, md)
                    calls += 1
                    where = f"{service.name}/{method.name} payload {k}"
                    problem = _check(where, service, method, answer)
                    if problem:
                        problems.append(problem)
                    if k < len(RANDOM_LENGTHS) and not _parses(method, raw):
                        unparsed += 1
                        served = answer.code is not grpc.StatusCode.UNIMPLEMENTED
                        if served and (
                            answer.code is not grpc.StatusCode.INVALID_ARGUMENT
                            or "does not parse" not in answer.details
                        ):
                            problems.append(
                                f"{where}: unparsable, answered {answer.code.name} "
                                f"{answer.details[:200]!r}"
                            )
    assert not problems, "\n".join(problems)
    assert calls >= 6 * sum(len(s.methods) for s in SERVICES)
    assert unparsed > calls // 4  # the random payloads mostly do not parse
    await _assert_serving(cluster)


async def _assert_serving(cluster: Cluster) -> None:
    """Every process answers health SERVING, and a v2 send and a v1 route work."""
    for address in set(cluster.addresses.values()):
        async with grpc.aio.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    sent = await _v2(cluster, "SendMessage", _send(), sv.SendMessageResponse)
    assert sent.status.code == v2.OK, sent.status
    async with grpc.aio.insecure_channel(cluster.addresses[SERVICES[1].full_name]) as channel:
        route = channel.unary_unary(
            f"/{SERVICES[1].full_name}/QueryRoute",
            request_serializer=ps.QueryRouteRequest.SerializeToString,
            response_deserializer=ps.QueryRouteResponse.FromString,
        )
        got = await route(ps.QueryRouteRequest(topic=TOPIC), timeout=5, metadata=cluster.metadata())
        assert got.HasField("route")


# -- the cases issue 28 found ---------------------------------------------------------------


def _send(**system: Any) -> sv.SendMessageRequest:
    properties = system.pop("user_properties", {})
    topic = system.pop("topic", TOPIC)
    message = v2.Message(
        topic=v2.Resource(name=topic),
        user_properties=properties,
        system_properties=v2.SystemProperties(
            message_id=system.pop("message_id", "01FUZZ"), message_type=v2.NORMAL, **system
        ),
        body=b"fuzz",
    )
    return sv.SendMessageRequest(messages=[message])


async def _v2(cluster: Cluster, rpc: str, request: Message, answer: Any) -> Any:
    service = SERVICES[3].full_name
    async with grpc.aio.insecure_channel(
        cluster.addresses[service],
        options=[("grpc.max_send_message_length", 64 * 1024 * 1024)],
    ) as channel:
        call = channel.unary_unary(
            f"/{service}/{rpc}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=answer.FromString,
        )
        return await call(request, timeout=10, metadata=cluster.metadata())


MB = "y" * (1024 * 1024)


@pytest.mark.parametrize(
    ("case", "request_", "code"),
    [
        ("1 MB tag", _send(tag=MB), v2.MESSAGE_PROPERTIES_TOO_LARGE),
        ("1 MB property value", _send(user_properties={"p": MB}), v2.MESSAGE_PROPERTIES_TOO_LARGE),
        ("1 MB message id", _send(message_id=MB), v2.MESSAGE_PROPERTIES_TOO_LARGE),
        ("1 MB message group", _send(message_group=MB), v2.ILLEGAL_MESSAGE_GROUP),
        (
            "100,000 properties",
            _send(user_properties={f"p{i}": "v" for i in range(100_000)}),
            v2.MESSAGE_PROPERTIES_TOO_LARGE,
        ),
        (
            "100,000 keys",
            _send(keys=[f"k{i}" for i in range(100_000)]),
            v2.MESSAGE_PROPERTIES_TOO_LARGE,
        ),
        ("topic over 127", _send(topic="T" * 128), v2.ILLEGAL_TOPIC),
        (
            "__CRC32# property",
            _send(user_properties={"__CRC32#": "1"}),
            v2.ILLEGAL_MESSAGE_PROPERTY_KEY,
        ),
    ],
)
@async_test
async def test_v2_send_past_a_limit_gets_its_code(
    cluster: Cluster, case: str, request_: sv.SendMessageRequest, code: int
) -> None:
    answer = await _v2(cluster, "SendMessage", request_, sv.SendMessageResponse)
    assert answer.status.code == code, (case, answer.status)
    assert len(answer.status.message) < 1000


def _forged(broker: str) -> str:
    return ReceiptHandle(
        broker, TOPIC, 0, 0, 0, 1, int(time.time() * 1000) + 60_000, 60_000
    ).encode()


@pytest.mark.parametrize("broker", ["broker-zz", "", "../../x"])
@async_test
async def test_a_forged_receipt_handle_is_invalid(cluster: Cluster, broker: str) -> None:
    topic = v2.Resource(name=TOPIC)
    group = v2.Resource(name="FuzzGroup")
    handle = _forged(broker)
    acked = await _v2(
        cluster, "AckMessage",
        sv.AckMessageRequest(group=group, topic=topic, entries=[
            sv.AckMessageEntry(message_id="m", receipt_handle=handle)
        ]),
        sv.AckMessageResponse,
    )  # fmt: skip
    assert acked.status.code == v2.INVALID_RECEIPT_HANDLE, acked.status
    changed = await _v2(
        cluster, "ChangeInvisibleDuration",
        sv.ChangeInvisibleDurationRequest(
            group=group, topic=topic, receipt_handle=handle, message_id="m",
            invisible_duration=_duration(30, 0),
        ),
        sv.ChangeInvisibleDurationResponse,
    )  # fmt: skip
    assert changed.status.code == v2.INVALID_RECEIPT_HANDLE, changed.status


def _duration(seconds: int, nanos: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=seconds, nanos=nanos)


@pytest.mark.parametrize(("seconds", "nanos"), [(2**62, 0), (30, -5), (-1, 0)])
@async_test
async def test_v2_invisible_durations_out_of_range(
    cluster: Cluster, seconds: int, nanos: int
) -> None:
    topic = v2.Resource(name=TOPIC)
    group = v2.Resource(name="FuzzGroup")
    received = await _v2_stream(
        cluster,
        sv.ReceiveMessageRequest(
            group=group, message_queue=v2.MessageQueue(topic=topic), batch_size=1,
            invisible_duration=_duration(seconds, nanos),
        ),
    )  # fmt: skip
    assert received == [v2.ILLEGAL_INVISIBLE_TIME]
    changed = await _v2(
        cluster, "ChangeInvisibleDuration",
        sv.ChangeInvisibleDurationRequest(
            group=group, topic=topic, receipt_handle=_forged("broker-a"), message_id="m",
            invisible_duration=_duration(seconds, nanos),
        ),
        sv.ChangeInvisibleDurationResponse,
    )  # fmt: skip
    assert changed.status.code == v2.ILLEGAL_INVISIBLE_TIME, changed.status


async def _v2_stream(cluster: Cluster, request: sv.ReceiveMessageRequest) -> list[int]:
    service = SERVICES[3].full_name
    async with grpc.aio.insecure_channel(cluster.addresses[service]) as channel:
        call = channel.unary_stream(
            f"/{service}/ReceiveMessage",
            request_serializer=sv.ReceiveMessageRequest.SerializeToString,
            response_deserializer=sv.ReceiveMessageResponse.FromString,
        )
        answers = call(request, timeout=10, metadata=cluster.metadata())
        return [a.status.code async for a in answers if a.HasField("status")]


@async_test
async def test_v2_query_offset_with_an_absurd_timestamp(cluster: Cluster) -> None:
    from google.protobuf.timestamp_pb2 import Timestamp

    answer = await _v2(
        cluster, "QueryOffset",
        sv.QueryOffsetRequest(
            message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC)),
            query_offset_policy=v2.TIMESTAMP, timestamp=Timestamp(seconds=2**62),
        ),
        sv.QueryOffsetResponse,
    )  # fmt: skip
    assert answer.status.code == v2.BAD_REQUEST, answer.status


async def _admin(cluster: Cluster, rpc: str, request: Message) -> grpc.aio.AioRpcError | None:
    service = SERVICES[2].full_name
    async with grpc.aio.insecure_channel(cluster.addresses[service]) as channel:
        call = channel.unary_unary(
            f"/{service}/{rpc}", request_serializer=type(request).SerializeToString
        )
        try:
            await call(request, timeout=10, metadata=cluster.metadata())
        except grpc.aio.AioRpcError as e:
            return e
    return None


@async_test
async def test_admin_refuses_a_path_subject_and_a_huge_secret(cluster: Cluster) -> None:
    acl = await _admin(
        cluster, "CreateAcl",
        adm.CreateAclRequest(subject="User:../../x", policy=adm.AclPolicy(
            resources=["Topic:a"], actions=["Pub"], decision="Allow"
        )),
    )  # fmt: skip
    assert acl is not None and acl.code() is grpc.StatusCode.INVALID_ARGUMENT, acl
    user = await _admin(
        cluster, "CreateUser",
        adm.CreateUserRequest(user=adm.UserInfo(username="big", secret_key="s" * 1024 * 1024)),
    )  # fmt: skip
    assert user is not None and user.code() is grpc.StatusCode.INVALID_ARGUMENT, user


@async_test
async def test_v1_send_with_the_store_crc_property_is_refused(cluster: Cluster) -> None:
    service = SERVICES[0].full_name
    async with grpc.aio.insecure_channel(cluster.addresses[service]) as channel:
        call = channel.unary_unary(
            f"/{service}/SendMessage", request_serializer=sn.SendMessageRequest.SerializeToString
        )
        from basalt.v1 import common_pb2 as pb

        request = sn.SendMessageRequest(
            message=pb.Message(topic=TOPIC, body=b"x", properties={"__CRC32#": "1"}), queue_id=0
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(request, timeout=10, metadata=cluster.metadata())
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "__CRC32#" in (refused.value.details() or "")

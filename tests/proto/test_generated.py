"""The generated ``basalt.v1`` modules: current, importable beside aetcd, and
faithful to the store's enums and record layout."""

from __future__ import annotations

import filecmp
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from basalt.common.message import Message as StoreMessage
from basalt.common.message import encode_host, offset_msg_id
from basalt.common.record import EncodedMessage, decode_record, split_records
from basalt.store.consumer_offsets import CommitStatus
from basalt.store.get_message import GetStatus
from basalt.store.message_filter import FILTER_TYPE_SQL92, FILTER_TYPE_TAG
from basalt.store.put_result import PutStatus
from basalt.v1 import (
    admin_pb2_grpc,
    common_pb2,
    pull_service_pb2,
    pull_service_pb2_grpc,
    store_node_pb2,
    store_node_pb2_grpc,
)

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "scripts" / "generate_protos.py"
REGENERATE = ".venv/bin/python scripts/generate_protos.py"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
MODULES = [
    f"basalt.v1.{p.stem}{suffix}"
    for p in sorted((REPO / "proto" / "basalt" / "v1").glob("*.proto"))
    for suffix in ("_pb2", "_pb2_grpc")
]


def _generated(root: Path) -> set[Path]:
    return {
        p.relative_to(root)
        for p in (root / "basalt").rglob("*")
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    }


def test_checked_in_generated_files_are_current(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    fresh, checked_in = _generated(tmp_path), _generated(REPO / "proto")
    assert fresh, "the generator wrote nothing"
    problems = [f"missing: proto/{p}" for p in sorted(fresh - checked_in)]
    problems += [f"no .proto generates it: proto/{p}" for p in sorted(checked_in - fresh)]
    problems += [
        f"stale: proto/{p}"
        for p in sorted(fresh & checked_in)
        if not filecmp.cmp(tmp_path / p, REPO / "proto" / p, shallow=False)
    ]
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}" for name in ("grpcio-tools", "mypy-protobuf")
    )
    assert not problems, (
        f"generated protobuf modules differ from the .proto files; run `{REGENERATE}` and "
        f"commit the result (generated here with {versions}):\n  " + "\n  ".join(problems)
    )


@pytest.mark.parametrize("aetcd_first", [True, False])
def test_imports_beside_aetcd_in_one_process(aetcd_first: bool) -> None:
    """aetcd registers bare file names (rpc.proto, kv.proto, auth.proto) in the
    process-wide descriptor pool; ours are basalt/v1/*.proto, so both load."""
    ours = "\n".join(f"importlib.import_module({m!r})" for m in MODULES)
    theirs = "import aetcd, aetcd.rpc.rpc_pb2"
    script = "\n".join(
        [
            "import importlib",
            theirs if aetcd_first else ours,
            ours if aetcd_first else theirs,
            "from google.protobuf import descriptor_pool",
            "pool = descriptor_pool.Default()",
            "pool.FindFileByName('rpc.proto')",
            "pool.FindFileByName('basalt/v1/common.proto')",
            "print('ok')",
        ]
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd="/", check=False
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_every_proto_file_registers_under_its_package_path() -> None:
    for name in MODULES:
        module = __import__(name, fromlist=["DESCRIPTOR"])
        if name.endswith("_pb2"):
            assert module.DESCRIPTOR.name.startswith("basalt/v1/")
            assert module.DESCRIPTOR.package == "basalt.v1"


# -- the store's enums, one to one ------------------------------------------------------


def _names(enum: object, prefix: str) -> set[str]:
    keys: list[str] = enum.keys()  # type: ignore[attr-defined]
    return {k.removeprefix(prefix) for k in keys if k != f"{prefix}UNSPECIFIED"}


def test_get_message_status_mirrors_get_status() -> None:
    assert _names(common_pb2.GetMessageStatus, "GET_MESSAGE_STATUS_") == {s.name for s in GetStatus}


def test_put_message_status_mirrors_put_status() -> None:
    assert _names(common_pb2.PutMessageStatus, "PUT_MESSAGE_STATUS_") == {s.name for s in PutStatus}


def test_commit_statuses_have_response_codes() -> None:
    code = common_pb2.ResponseCode
    expected = {
        CommitStatus.OK: code.RESPONSE_CODE_SUCCESS,
        CommitStatus.STALE_RESET_EPOCH: code.RESPONSE_CODE_STALE_RESET_EPOCH,
        CommitStatus.INVALID_NAME: code.RESPONSE_CODE_INVALID_PARAMETER,
        CommitStatus.INVALID_QUEUE_ID: code.RESPONSE_CODE_INVALID_PARAMETER,
        CommitStatus.INVALID_OFFSET: code.RESPONSE_CODE_INVALID_PARAMETER,
    }
    assert set(expected) == set(CommitStatus)


def test_response_codes_keep_rocketmq_numbers() -> None:
    # RocketMQ's RemotingSysResponseCode and ResponseCode.
    rocketmq = {
        "SUCCESS": 0,
        "SYSTEM_ERROR": 1,
        "SYSTEM_BUSY": 2,
        "FLUSH_DISK_TIMEOUT": 10,
        "SLAVE_NOT_AVAILABLE": 11,
        "FLUSH_SLAVE_TIMEOUT": 12,
        "MESSAGE_ILLEGAL": 13,
        "SERVICE_NOT_AVAILABLE": 14,
        "VERSION_NOT_SUPPORTED": 15,
        "NO_PERMISSION": 16,
        "TOPIC_NOT_EXIST": 17,
        "TOPIC_EXIST_ALREADY": 18,
        "PULL_NOT_FOUND": 19,
        "PULL_RETRY_IMMEDIATELY": 20,
        "PULL_OFFSET_MOVED": 21,
        "QUERY_NOT_FOUND": 22,
        "SUBSCRIPTION_PARSE_FAILED": 23,
        "SUBSCRIPTION_NOT_EXIST": 24,
        "SUBSCRIPTION_GROUP_NOT_EXIST": 26,
        "INVALID_PARAMETER": 29,
        "CONSUMER_NOT_ONLINE": 206,
        "BROKER_NOT_EXIST": 211,
    }
    for name, number in rocketmq.items():
        assert common_pb2.ResponseCode.Value(f"RESPONSE_CODE_{name}") == number, name
    # Basalt's own codes stay clear of RocketMQ's range.
    own = set(common_pb2.ResponseCode.keys()) - {f"RESPONSE_CODE_{n}" for n in rocketmq}
    assert own == {
        "RESPONSE_CODE_STALE_RESET_EPOCH",
        "RESPONSE_CODE_NOT_MASTER",
        "RESPONSE_CODE_IN_SYNC_REPLICAS_NOT_ENOUGH",
    }
    assert all(common_pb2.ResponseCode.Value(n) >= 10_000 for n in own)
    assert all(common_pb2.ResponseCode.Value(n) >= 10000 for n in own)


def test_client_statuses_keep_rocketmq_names() -> None:
    assert _names(common_pb2.PullStatus, "PULL_STATUS_") == {
        "FOUND",
        "NO_NEW_MSG",
        "NO_MATCHED_MSG",
        "OFFSET_ILLEGAL",
    }
    assert _names(common_pb2.SendStatus, "SEND_STATUS_") == {
        "SEND_OK",
        "FLUSH_DISK_TIMEOUT",
        "FLUSH_SLAVE_TIMEOUT",
        "SLAVE_NOT_AVAILABLE",
    }
    assert set(common_pb2.ExpressionType.keys()) == {
        f"EXPRESSION_TYPE_{FILTER_TYPE_TAG}",
        f"EXPRESSION_TYPE_{FILTER_TYPE_SQL92}",
    }
    # An unset subscription type is TAG, as RocketMQ treats a missing one.
    assert common_pb2.Subscription().type == common_pb2.EXPRESSION_TYPE_TAG


# -- services -----------------------------------------------------------------------------


def _methods(module: object, service: str) -> dict[str, tuple[bool, bool]]:
    descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    return {m.name: (m.client_streaming, m.server_streaming) for m in descriptor.methods}


def test_services_and_methods() -> None:
    unary = (False, False)
    assert _methods(store_node_pb2, "StoreNode") == {
        **dict.fromkeys(
            [
                "SendMessage",
                "SendBatch",
                "GetMessage",
                "GetMessages",
                "GetMinMaxOffset",
                "SearchOffset",
                "QueryConsumerOffset",
                "UpdateConsumerOffset",
                "QueryMessage",
                "ViewMessage",
                "ResetOffset",
                "GetRuntimeInfo",
                "PopMessages",
                "AckMessages",
                "ChangeInvisibleDuration",
                "RecallMessage",
                "GetScheduleStatus",
                "ConsumerSendMsgBack",
                "EndTransaction",
            ],
            unary,
        ),
        "SendStream": (True, True),
        "GetMessagesStream": (True, True),
        "WatchTransactionChecks": (False, True),
    }
    assert _methods(pull_service_pb2, "PullService") == {
        "QueryRoute": unary,
        "Pull": unary,
        "PullBatch": unary,
        "Session": (True, True),
        "ListConsumers": unary,
        "NotifyConsumers": unary,
        "LockQueues": unary,
        "UnlockQueues": unary,
        "QueryOffset": unary,
        "CommitOffset": unary,
    }
    for stub in (
        store_node_pb2_grpc.StoreNodeStub,
        pull_service_pb2_grpc.PullServiceStub,
        admin_pb2_grpc.AdminStub,
    ):
        assert callable(stub)


# -- round trips --------------------------------------------------------------------------


def test_message_round_trip() -> None:
    message = common_pb2.Message(
        topic="TopicTest",
        tags="TagA",
        keys=["order-1", "order-2"],
        properties={"UNIQ_KEY": "ABC", "a": "1"},
        body=b"\x00hello\xff",
        born_timestamp_ms=1_700_000_000_123,
        born_host="[::1]:5000",
        delay_level=3,
        flag=7,
    )
    again = common_pb2.Message.FromString(message.SerializeToString())
    assert again == message
    assert list(again.keys) == ["order-1", "order-2"]
    assert dict(again.properties) == {"UNIQ_KEY": "ABC", "a": "1"}


def test_records_carry_store_records_byte_for_byte() -> None:
    host = encode_host("10.0.0.7:10911")
    raw = [
        EncodedMessage(
            StoreMessage("TopicTest", b"m%d" % i, queue_id=2, tags="TagA", keys=[f"k{i}"]),
            store_host=host,
        ).encode(queue_offset=i, physical_offset=1000 + 100 * i, store_timestamp_ms=5)
        for i in range(3)
    ]
    response = store_node_pb2.GetMessageResponse(
        status=common_pb2.GET_MESSAGE_STATUS_FOUND,
        next_begin_offset=3,
        min_offset=0,
        max_offset=3,
        records=common_pb2.Records(data=b"".join(raw), count=len(raw)),
    )
    again = store_node_pb2.GetMessageResponse.FromString(response.SerializeToString())
    assert again.records.count == 3
    records = [decode_record(bytes(r)) for r in split_records(again.records.data)]
    assert [r.body for r in records] == [b"m0", b"m1", b"m2"]
    assert [r.queue_offset for r in records] == [0, 1, 2]
    assert records[1].keys == ["k1"] and records[1].tags == "TagA"
    assert records[2].msg_id == offset_msg_id(host, 1200)


def test_send_batch_is_one_of_two_forms() -> None:
    by_records = store_node_pb2.SendBatchRequest(topic="T", queue_id=1, records=b"\x00\x01")
    assert by_records.WhichOneof("batch") == "records"
    by_messages = store_node_pb2.SendBatchRequest(
        topic="T", messages=common_pb2.MessageList(messages=[common_pb2.Message(body=b"x")])
    )
    assert by_messages.WhichOneof("batch") == "messages"
    by_messages.records = b"r"  # setting one form clears the other
    assert by_messages.WhichOneof("batch") == "records"
    assert not by_messages.HasField("messages")
    assert store_node_pb2.SendBatchRequest(topic="T").WhichOneof("batch") is None


def test_optional_commit_offset_tells_zero_from_unset() -> None:
    queue = common_pb2.MessageQueue(topic="T", broker_name="broker-a", queue_id=0)
    unset = pull_service_pb2.PullRequest(group="g", queue=queue, offset=5, max_nums=32)
    zero = pull_service_pb2.PullRequest(group="g", queue=queue, commit_offset=0, reset_epoch=0)
    assert not pull_service_pb2.PullRequest.FromString(unset.SerializeToString()).HasField(
        "commit_offset"
    )
    parsed = pull_service_pb2.PullRequest.FromString(zero.SerializeToString())
    assert parsed.HasField("commit_offset") and parsed.commit_offset == 0
    assert parsed.HasField("reset_epoch")


def test_pull_response_round_trip() -> None:
    response = common_pb2.PullResponse(
        code=common_pb2.RESPONSE_CODE_PULL_OFFSET_MOVED,
        status=common_pb2.PULL_STATUS_OFFSET_ILLEGAL,
        store_status=common_pb2.GET_MESSAGE_STATUS_OFFSET_TOO_SMALL,
        next_begin_offset=40,
        min_offset=40,
        max_offset=90,
        commit=common_pb2.CommitResult(
            code=common_pb2.RESPONSE_CODE_STALE_RESET_EPOCH, reset_epoch=4
        ),
    )
    again = common_pb2.PullResponse.FromString(response.SerializeToString())
    assert again == response
    assert again.commit.reset_epoch == 4
    # An unset code reads as SUCCESS, as in RocketMQ.
    assert common_pb2.PullResponse().code == common_pb2.RESPONSE_CODE_SUCCESS


def test_session_frames_round_trip() -> None:
    opening = pull_service_pb2.SessionRequest(
        open=pull_service_pb2.OpenSession(
            group="g",
            client_id="10.0.0.1@123",
            subscriptions=[
                common_pb2.TopicSubscription(
                    topic="T",
                    subscription=common_pb2.Subscription(
                        type=common_pb2.EXPRESSION_TYPE_SQL92, expression="a > 5"
                    ),
                )
            ],
            client_version="basalt-py 0.1.0",
        )
    )
    assert pull_service_pb2.SessionRequest.FromString(opening.SerializeToString()) == opening
    queue = common_pb2.MessageQueue(topic="T", broker_name="broker-a", queue_id=1)
    command = pull_service_pb2.SessionResponse(
        command=pull_service_pb2.Command(
            command_id="c-1",
            timeout_ms=5000,
            reset_offset=pull_service_pb2.ResetOffsetCommand(
                topic="T",
                offsets=[common_pb2.QueueOffset(queue=queue, offset=17, reset_epoch=2)],
            ),
        )
    )
    again = pull_service_pb2.SessionResponse.FromString(command.SerializeToString())
    assert again.WhichOneof("frame") == "command"
    assert again.command.WhichOneof("body") == "reset_offset"
    assert again.command.reset_offset.offsets[0].offset == 17
    ack = pull_service_pb2.SessionRequest(
        ack=pull_service_pb2.CommandAck(command_id="c-1", ok=True)
    )
    assert pull_service_pb2.SessionRequest.FromString(ack.SerializeToString()).ack.ok


def test_reset_offset_response_map() -> None:
    response = store_node_pb2.ResetOffsetResponse(
        offsets={0: 10, 1: 0, 7: 2**62}, reset_epoch=3, broker_name="broker-a"
    )
    again = store_node_pb2.ResetOffsetResponse.FromString(response.SerializeToString())
    assert dict(again.offsets) == {0: 10, 1: 0, 7: 2**62}
    assert again.reset_epoch == 3

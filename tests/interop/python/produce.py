"""Send messages with the official RocketMQ 5 Python Producer (run as a script,
never imported: the client registers apache.rocketmq.v2 in protobuf's pool).

    python produce.py ENDPOINTS [tls] < messages.json

``tls``: dial with ``tls_enable`` (the server's CA trusted through
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, as gRPC reads it).

``messages.json``: ``{"topic": T, "messages": [{"body": str, "tag": str?,
"keys": [str]?, "properties": {str: str}?, "group": str?}], "credentials":
{"accessKey": str, "secretKey": str}?}``. Prints one JSON list: per message
``{"message_id": ...}`` or ``{"error": str}`` (every message's, when the
producer could not start: a refused signature).
"""

from __future__ import annotations

import json
import sys

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main() -> int:
    endpoints = sys.argv[1]
    tls = sys.argv[2:] == ["tls"]
    spec = json.load(sys.stdin)
    given = spec.get("credentials") or {}
    credentials = Credentials(given.get("accessKey", ""), given.get("secretKey", ""))
    producer = Producer(
        ClientConfiguration(endpoints, credentials, request_timeout=5),
        (spec["topic"],),
        tls_enable=tls,
    )
    try:
        producer.startup()
    except Exception as e:
        error = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps([error] * len(spec["messages"])), flush=True)
        return 0
    out = []
    try:
        for m in spec["messages"]:
            message = Message()
            message.topic = spec["topic"]
            message.body = m["body"].encode()
            if m.get("tag"):
                message.tag = m["tag"]
            for key in m.get("keys", []):
                message.keys = key  # the setter adds one key per assignment
            if m.get("group"):
                message.message_group = m["group"]
            for k, v in m.get("properties", {}).items():
                message.add_property(k, v)
            try:
                out.append({"message_id": producer.send(message).message_id})
            except Exception as e:
                out.append({"error": f"{type(e).__name__}: {e}"})
    finally:
        producer.shutdown()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

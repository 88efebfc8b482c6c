"""Transactional messages with the official RocketMQ 5 Python Producer (run as a
script, never imported: the client registers apache.rocketmq.v2 in protobuf's
pool).

    python transaction.py ENDPOINTS < spec.json

``spec.json``: ``{"topic": T, "messages": [{"body": str, "end": "commit" |
"rollback" | "hang"}], "checker": "commit" | "rollback", "check_until":
[body]?, "wait_s": int?}``. For each message: begins a transaction, sends
the half message and prints ``{"half": body, "message_id", "transaction_id"}``
as one line, then commits or rolls back (``end``) and prints ``{"ended":
body, "error": str | null}``; ``hang`` stops there and sleeps (the test kills
the process: the half is left to the store-node's check). The producer's
TransactionChecker answers ``checker`` to every check and prints ``{"checked":
body, "message_id", "topic"}`` per check. With ``check_until``, the script
waits (at most ``wait_s``, 60) until those bodies were checked. Prints
``{"done": true}`` last.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    Message,
    Producer,
    TransactionChecker,
    TransactionResolution,
)

_lock = threading.Lock()


def _say(line: dict[str, Any]) -> None:
    with _lock:
        print(json.dumps(line), flush=True)


class _Checker(TransactionChecker):
    def __init__(self, answer: int) -> None:
        self.answer = answer
        self.checked: set[str] = set()

    def check(self, message: Any) -> int:
        body = message.body.decode()
        self.checked.add(body)
        _say({"checked": body, "message_id": message.message_id, "topic": message.topic})
        return self.answer


def main() -> int:
    spec = json.load(sys.stdin)
    topic = spec["topic"]
    answer = spec.get("checker", "commit")
    checker = _Checker(
        TransactionResolution.COMMIT if answer == "commit" else TransactionResolution.ROLLBACK
    )
    producer = Producer(
        ClientConfiguration(sys.argv[1], Credentials(), request_timeout=5), (topic,), checker
    )
    producer.startup()
    try:
        for m in spec.get("messages", []):
            message = Message()
            message.topic = topic
            message.body = m["body"].encode()
            transaction = producer.begin_transaction()
            receipt = producer.send(message, transaction)
            _say({"half": m["body"], "message_id": receipt.message_id,
                  "transaction_id": receipt.transaction_id})  # fmt: skip
            if m["end"] == "hang":
                time.sleep(3600)
            error = None
            try:
                transaction.commit() if m["end"] == "commit" else transaction.rollback()
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
            _say({"ended": m["body"], "error": error})
        deadline = time.monotonic() + spec.get("wait_s", 60)
        wanted = set(spec.get("check_until", []))
        while not wanted <= checker.checked and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)  # the checker's EndTransaction goes out after check() returns
    finally:
        producer.shutdown()
    _say({"done": True})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

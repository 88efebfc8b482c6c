"""A full disk (here: a file-size limit) refuses sends with a clear status and
loses nothing that was acknowledged."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from basalt.store import Message, MessageStore, MessageStoreConfig
from tests.support.stores import SMALL_COMMITLOG_FILE, SMALL_CQ_FILE, SMALL_INDEX
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

_CHILD = textwrap.dedent(
    """
    import json, resource, signal, sys
    from pathlib import Path
    from basalt.store import Message, MessageStore, MessageStoreConfig

    config = MessageStoreConfig(
        store_path_root_dir=Path(sys.argv[1]),
        mapped_file_size_commit_log=int(sys.argv[3]),
        mapped_file_size_consume_queue=int(sys.argv[4]),
        max_hash_slot_num=512,
        max_index_num=2048,
    )
    store = MessageStore.open(config)
    assert store.put_message(Message("Warm", b"creates the first file")).ok
    # From here no write may reach past the limit: the first commitlog file fills
    # up half way, and the write that crosses the limit comes back short.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    for i in range(200):
        batch = [Message("Full", f"{i}-{j}".encode() * 40) for j in range(4)]
        r = store.put_messages(batch)
        print(json.dumps({"status": r.status.value, "detail": r.detail,
                          "offsets": list(r.queue_offsets), "i": i}), flush=True)
    store.shutdown()
    """
)


def test_sends_past_the_disk_limit_fail_clearly_and_acknowledged_ones_survive(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    limit = SMALL_COMMITLOG_FILE // 2 + 100  # not on a record boundary: a short write
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(root),
            str(limit),
            str(SMALL_COMMITLOG_FILE),
            str(SMALL_CQ_FILE),
        ],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    results = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(results) == 200, child.stderr
    statuses = {r["status"] for r in results}
    assert statuses == {"PUT_OK", "CREATE_MAPPED_FILE_FAILED"}
    refused = [r for r in results if r["status"] != "PUT_OK"]
    assert all("cannot write" in r["detail"] for r in refused)
    acked = {
        (r["i"], j): off
        for r in results
        if r["status"] == "PUT_OK"
        for j, off in enumerate(r["offsets"])
    }

    config = MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=SMALL_COMMITLOG_FILE,
        mapped_file_size_consume_queue=SMALL_CQ_FILE,
        **SMALL_INDEX,
    )
    with MessageStore(config) as store:
        for (i, j), offset in acked.items():
            record = store.get_message_by_queue_offset("Full", 0, offset)
            assert record is not None
            assert record.body == f"{i}-{j}".encode() * 40
        # With room again, sends continue right after the acknowledged ones.
        again = store.put_message(Message("Full", b"after"))
        assert again.ok
        assert again.queue_offsets == (len(acked),)

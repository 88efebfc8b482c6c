"""The chart's pre-upgrade hook (templates/upgrade-mastership.yaml): before
``helm upgrade`` rolls the store-nodes, make member 0 of each replicated broker
group its master, so the StatefulSet's roll (highest ordinal first) stops the
slaves first and the master last, which then hands over to an already-updated
slave on SIGTERM (docs/helm.md#replicated-broker-groups).

Run by the Job as ``python3 -c <this file> --cluster C --wait-s S BROKER...``,
in the Basalt image with the admin pods' environment (``BASALT_ETCD``,
``BASALT_TLS_*``, ``BASALT_CREDENTIALS``): it calls the documented CLI,
``basalt admin electMaster -b BROKER -n 0`` then ``brokerStatus``, not
Basalt's modules, so it depends on nothing but the verbs' flags and ``--json``.

Contract: it never blocks an upgrade. It exits 0 whatever happens; a group
whose election is refused (member 0 not registered, not in the in-sync set,
no such group yet) or fails (etcd unreachable) is logged with the CLI's reason
and left as it is - its master still hands over when its turn to stop comes.
After the elections it waits, at most ``--wait-s`` in all, until every
registered member of each group it moved is back in the in-sync set (the
set restarts from the new master alone), so the roll's first stop does not
meet a group still short of in-sync members; past that it logs and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence

#: The new master: the ordinal the roll replaces last.
TARGET_ID = 0
#: Bounds one CLI call (a Python start plus an etcd round trip or a few): a hung
#: call must not hold the upgrade past the Job's deadline.
CALL_TIMEOUT_S = 30.0
#: Between two reads of a group's state while waiting for its members.
POLL_INTERVAL_S = 1.0
#: brokerStatus' member column for a member whose lease has ended.
NOT_REGISTERED = "(not registered)"


def log(message: str) -> None:
    print(f"masters-to-ordinal-zero: {message}", flush=True)


def admin(verb: str, cluster: str, *args: str) -> tuple[bool, str]:
    """``basalt admin VERB ARGS --cluster CLUSTER --json``: (exit status 0, its
    stdout) or (False, why it failed: its stderr, or the timeout)."""
    argv = ["basalt", "admin", verb, *args, "--cluster", cluster, "--json"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{' '.join(argv)}: {e}"
    if done.returncode != 0:
        return False, (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
    return True, done.stdout


def elect(broker: str, cluster: str) -> bool:
    """Make member 0 ``broker``'s master; whether it now is (logged either way)."""
    ok, out = admin("electMaster", cluster, "-b", broker, "-n", str(TARGET_ID))
    if not ok:
        log(
            f"{broker}: mastership left as it is ({out}); its master hands over to an "
            "in-sync slave when the roll stops it"
        )
        return False
    rows = {row["key"]: row["value"] for row in json.loads(out)}
    log(
        f"{broker}: master {rows.get('previousMaster')} -> {rows.get('master')}, "
        f"epoch {rows.get('epoch')} ({rows.get('result')})"
    )
    return True


def caught_up(broker: str, cluster: str) -> bool:
    """Member 0 is master and every registered member of ``broker`` is in sync."""
    ok, out = admin("brokerStatus", cluster, "-b", broker)
    if not ok:
        return False
    rows = {str(row["key"]): str(row["value"]) for row in json.loads(out)}
    if rows.get("groupMaster") != str(TARGET_ID):
        return False
    in_sync = {int(i) for i in rows.get("groupSyncStateSet", "").split(",") if i}
    registered = {
        int(key.removeprefix("member"))
        for key, value in rows.items()
        if key.startswith("member") and NOT_REGISTERED not in value
    }
    return registered <= in_sync


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="masters-to-ordinal-zero")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--wait-s", type=float, required=True)
    parser.add_argument("brokers", nargs="*")
    args = parser.parse_args(argv)
    moved = [broker for broker in args.brokers if elect(broker, args.cluster)]
    deadline = time.monotonic() + args.wait_s
    waiting = list(moved)
    while waiting:
        waiting = [broker for broker in waiting if not caught_up(broker, args.cluster)]
        if waiting and time.monotonic() >= deadline:
            log(
                f"{', '.join(waiting)}: not every member in sync after {args.wait_s:g} s; "
                "upgrading anyway"
            )
            break
        if waiting:
            time.sleep(POLL_INTERVAL_S)
    for broker in moved:
        if broker not in waiting:
            log(f"{broker}: member {TARGET_ID} is master, every registered member in sync")
    return 0


def run(argv: Sequence[str]) -> int:
    """:func:`main`, and 0 even when it raised: an answer of a shape this file
    does not expect is logged, never a failed hook (which would fail the upgrade)."""
    try:
        return main(argv)
    except Exception as e:  # the contract: never block an upgrade
        log(f"stopped early, mastership left as it is: {type(e).__name__}: {e}")
        return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

"""services.process: what every service process shares."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from basalt.services.process import SERVICE_ENV, keep_large_buffers, service_env
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_large_buffers_are_kept_in_the_heap_on_glibc() -> None:
    # mallopt answers 1 for each parameter it took; a wrong number answers 0.
    assert keep_large_buffers() is True


def test_service_env_adds_the_grpc_settings_and_the_callers_own_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    monkeypatch.setenv("BASALT_TEST_MARK", "kept")
    env = service_env()
    assert env["GRPC_EXPERIMENTS"] == SERVICE_ENV["GRPC_EXPERIMENTS"]
    assert "-event_engine_listener" in env["GRPC_EXPERIMENTS"]
    assert env["BASALT_TEST_MARK"] == "kept"
    monkeypatch.setenv("GRPC_EXPERIMENTS", "")  # an operator's choice, even "none"
    assert service_env()["GRPC_EXPERIMENTS"] == ""


@pytest.mark.parametrize("preset", [None, ""])
def test_rerun_with_service_env_runs_the_same_command_again_unless_set(
    preset: str | None,
) -> None:
    code = (
        "import os, sys\n"
        "print('start', os.getpid(), flush=True)\n"
        "from basalt.services.process import rerun_with_service_env\n"
        "rerun_with_service_env()\n"
        "print('run', os.getpid(), repr(os.environ['GRPC_EXPERIMENTS']), sys.argv[1:])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if preset is not None:
        env["GRPC_EXPERIMENTS"] = preset
    done = subprocess.run(
        [sys.executable, "-c", code, "an-arg"],
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    wanted = SERVICE_ENV["GRPC_EXPERIMENTS"] if preset is None else preset
    pid = lines[0].split()[1]
    # Run again (same pid: exec'd in place) with the same arguments, once.
    assert lines[-1] == f"run {pid} {wanted!r} ['an-arg']"
    assert len(lines) == (3 if preset is None else 2)

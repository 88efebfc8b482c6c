"""services.process: what every service process shares."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from basalt.services.process import (
    EVENT_LOOPS,
    SERVICE_ENV,
    RuntimeConfig,
    keep_large_buffers,
    raise_open_files_limit,
    run_on,
    service_env,
    stopping,
)
from tests.support.polling import eventually_sync
from tests.support.processes import ServiceProcess, store_node_process
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.parametrize(("event_loop", "module"), [("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_a_service_runs_on_the_event_loop_its_settings_name(event_loop: str, module: str) -> None:
    assert run_on(event_loop, _loop_module()).split(".")[0] == module


_SERVE = """
import argparse, asyncio, gc, sys
from basalt.services import process
parser = argparse.ArgumentParser()
process.add_common_arguments(parser, "basalt-test")
async def serve(args):
    uvloop = type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    return (gc.get_freeze_count() > 1000) + 2 * uvloop
sys.exit(process.run(serve, parser.parse_args(sys.argv[1:])))
"""


@pytest.mark.parametrize(("flags", "status"), [((), 3), (("--event-loop", "asyncio"), 1)])
def test_a_service_runs_on_its_event_loop_with_its_imports_frozen(
    flags: tuple[str, ...], status: int
) -> None:
    # The exit status says it: 1 for the imports' objects frozen (gc.freeze), 2 for uvloop.
    done = subprocess.run(
        [sys.executable, "-c", _SERVE, *flags], capture_output=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert done.returncode == status, done.stderr.decode()


def test_the_event_loop_is_uvloop_unless_set_and_an_unknown_one_is_refused() -> None:
    assert RuntimeConfig().event_loop == "uvloop"
    assert EVENT_LOOPS == ("uvloop", "asyncio")
    with pytest.raises(ValueError, match="event_loop"):
        RuntimeConfig(event_loop="tokio")


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


@pytest.mark.parametrize(
    ("preset", "grpc_first", "reruns"),
    [(None, True, True), (None, False, False), ("", True, False)],
)
def test_rerun_with_service_env_runs_again_only_when_grpc_started_without_the_settings(
    preset: str | None, grpc_first: bool, reruns: bool
) -> None:
    """Importing basalt puts basalt.GRPC_ENV in the environment before gRPC
    reads it, unless gRPC came first: only then does the command run again."""
    code = (
        "import os, sys\n"
        + ("import grpc\n" if grpc_first else "")
        + "print('start', os.getpid(), flush=True)\n"
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
    assert len(lines) == (3 if reruns else 2)


def _soft_open_files(pid: int) -> int:
    """The soft "Max open files" of process ``pid``, as the kernel reports it."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError(f"no open files limit for {pid}")


@pytest.mark.slow
def test_a_service_process_raises_its_open_files_limit_to_the_hard_one(
    tmp_path: Path, processes: list[ServiceProcess]
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard // 2)
    # The child inherits this process's limits at fork: lower the soft one only
    # for the spawn, as a distribution's default 1,024 would be.
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        node = store_node_process(tmp_path)
        processes.append(node)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    node.wait_serving()
    assert _soft_open_files(node.proc.pid) == hard
    log = (tmp_path / "broker-a.log").read_text()
    assert f"open files limit raised from {low} to {hard}" in log
    assert node.stop() == 0


def test_raising_the_open_files_limit_where_it_is_the_hard_one_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        with caplog.at_level(logging.INFO, logger="basalt.services.process"):
            assert raise_open_files_limit() == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert "already the hard limit" in caplog.text


def test_sigquit_dumps_every_threads_stack_and_the_service_goes_on(
    tmp_path: Path, processes: list[ServiceProcess]
) -> None:
    node = store_node_process(tmp_path)
    processes.append(node)
    node.wait_serving()
    node.proc.send_signal(signal.SIGQUIT)
    log = tmp_path / "broker-a.log"
    eventually_sync(lambda: "Current thread" in log.read_text(), what="the stack dump")
    text = log.read_text()
    assert text.count("Thread 0x") >= 2  # the loop's and the store's threads
    assert node.proc.poll() is None  # still serving
    assert node.stop() == 0


async def _hang_until(released: asyncio.Event) -> None:
    await released.wait()


@pytest.mark.parametrize("event_loop", EVENT_LOOPS)
def test_a_stop_past_its_grace_names_the_await_it_hangs_on(
    event_loop: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """A stop still under way after its grace and the report delay logs each
    task's await chain down to what it waits on, and dumps the threads; a stop
    that ends in time reports nothing."""

    async def stop(hang_s: float) -> None:
        released = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.call_later(hang_s, released.set)
        with stopping(0.05, report_after_s=0.25):
            await asyncio.create_task(_hang_until(released), name="the-hung-stop")
        await asyncio.sleep(0.5)  # past when a report would have come

    caplog.set_level(logging.INFO, logger="basalt.services.process")
    run_on(event_loop, stop(0.0))
    assert [r.getMessage() for r in caplog.records] == ["stopping"]
    assert "Thread" not in capfd.readouterr().err
    caplog.clear()
    run_on(event_loop, stop(0.8))
    [report] = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = report.getMessage()
    assert text.startswith("still stopping after 0 s"), text
    lines = text.splitlines()
    chain = lines[lines.index("the-hung-stop") :]
    assert "in _hang_until" in chain[1], chain
    assert "in Event.wait" in chain[2], chain
    assert chain[3].startswith("  awaits <Future pending"), chain
    assert "in run_on" in capfd.readouterr().err  # the main thread's stack, from faulthandler

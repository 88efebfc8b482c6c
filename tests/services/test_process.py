"""services.process: what every service process shares."""

from __future__ import annotations

import platform

import pytest

from services.process import SERVICE_ENV, keep_large_buffers, service_env


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

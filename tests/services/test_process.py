"""services.process: what every service process shares."""

from __future__ import annotations

import platform

import pytest

from services.process import keep_large_buffers


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_large_buffers_are_kept_in_the_heap_on_glibc() -> None:
    # mallopt answers 1 for each parameter it took; a wrong number answers 0.
    assert keep_large_buffers() is True

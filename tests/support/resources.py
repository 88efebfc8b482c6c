"""What this process holds: open file descriptors and resident memory (Linux /proc)."""

from __future__ import annotations

import os


def open_fds() -> int:
    """Descriptors this process has open."""
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    """This process's resident set size (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")

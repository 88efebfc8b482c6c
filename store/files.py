"""Small file helpers: the root's ``lock`` and ``abort`` files, atomic writes."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from basalt.store.errors import StoreLockedError


class RootLock:
    """An exclusive, non-blocking ``flock`` on ``<root>/lock``.

    flock locks belong to the open file description, so a second store in the
    same process is refused just like one in another process.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "lock"
        self._fd = -1

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(self.root) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def fsync_dir(path: Path) -> None:
    """fsync a directory so a create, rename or unlink in it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_abort_file(path: Path) -> None:
    """Mark the store as running: a crash leaves this file behind."""
    path.touch()
    fsync_dir(path.parent)


def remove_abort_file(path: Path) -> None:
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so a crash leaves the old or the new file, never a mix."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)

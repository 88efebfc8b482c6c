"""Small file helpers: the root's ``lock`` and ``abort`` files, atomic writes, and
the hook that tells a store's space guard a data file was created."""

from __future__ import annotations

import ctypes
import fcntl
import os
import threading
from collections.abc import Callable
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


def _load_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs(2)`` (Linux), or None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn: Callable[[int], int] = libc.syncfs
    except (OSError, AttributeError):
        return None
    return fn


_SYNCFS = _load_syncfs()


def syncfs_available() -> bool:
    return _SYNCFS is not None


def syncfs(path: Path) -> None:
    """Write back and commit every dirty page and inode of the filesystem holding
    ``path`` (``syncfs(2)``): one call where fdatasync of each of thousands of small
    files would each force a journal commit. Raises OSError as fsync would (Linux
    reports writeback errors through syncfs since 5.8); RuntimeError where there is no
    syncfs (check :func:`syncfs_available`)."""
    if _SYNCFS is None:
        raise RuntimeError("syncfs(2) is not available on this platform")
    fd = os.open(path, os.O_RDONLY)
    try:
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
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


def set_aside(path: Path, quarantine_dir: Path, name: str) -> Path:
    """Move ``path`` (a file, a folder, a link) into ``quarantine_dir`` (created) as
    ``name``, or ``name.1``, ``name.2``, ... so an earlier one is never replaced;
    both folders are fsynced. Returns where it went. Raises OSError when the move
    fails (another filesystem is not supported: the quarantine is under the root).

    For damaged files a start cannot use: kept for an operator, read by nothing.
    """
    quarantine_dir.mkdir(parents=True, exist_ok=True)
    target = quarantine_dir / name
    n = 1
    while os.path.lexists(target):
        target = quarantine_dir / f"{name}.{n}"
        n += 1
    os.rename(path, target)
    fsync_dir(path.parent)
    fsync_dir(quarantine_dir)
    return target


#: Told the path of every data file created under a registered root (see
#: :func:`watch_file_creation`); must be quick and must not raise.
CreationListener = Callable[[Path], None]

_creation_lock = threading.Lock()
_creation_listeners: dict[Path, CreationListener] = {}
#: Each watched root as given and as resolved, with a trailing separator: the
#: prefixes that :func:`file_created` matches a path's text against.
_creation_prefixes: dict[Path, tuple[str, ...]] = {}


def watch_file_creation(root: Path, listener: CreationListener) -> Callable[[], None]:
    """Call ``listener`` after each data file (CommitLog, ConsumeQueue, index) is
    created under ``root``; returns the function that stops it.

    Keyed by root so several stores in one process (tests, tools) each hear
    only their own files. The space guard runs here: a new file is where a
    filling disk shows first, long before a timer would notice.
    """
    key = root.resolve()
    with _creation_lock:
        _creation_listeners[key] = listener
        _creation_prefixes[key] = tuple({os.path.join(p, "") for p in (str(root), str(key))})

    def stop() -> None:
        with _creation_lock:
            if _creation_listeners.get(key) is listener:
                del _creation_listeners[key]
                del _creation_prefixes[key]

    return stop


def file_created(path: Path) -> None:
    """Tell the listener of the root holding ``path`` (if any) that it was created."""
    if not _creation_listeners:
        return  # no store in this process watches: tools, most unit tests
    # A store names its files from its own root, so the path's text starts with
    # the root as given (or resolved): matched without resolving, which walks
    # every component with lstat in Python and cost a new queue's first put
    # ~0.1 ms. A path spelled another way (through a symlink) is resolved.
    text = str(path)
    with _creation_lock:
        listeners = [
            _creation_listeners[root]
            for root, prefixes in _creation_prefixes.items()
            if text.startswith(prefixes)
        ]
        if not listeners:
            resolved = path.resolve()
            listeners = [
                fn for root, fn in _creation_listeners.items() if resolved.is_relative_to(root)
            ]
    for listener in listeners:
        listener(path)

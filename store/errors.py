"""The store's exception hierarchy: corruption and misuse.

Expected outcomes (a message too large, an offset past the end) are enum
statuses in result dataclasses, never exceptions. What is raised here means the
caller misused the store or the disk holds something the store cannot trust.
:class:`StoreError` is the base of every exception class in ``store/``, these
and the ones that live beside the code raising them (``Sql92ParseError``,
``UnknownFilterTypeError``, ``InvalidOffsetRequestError``, ``StoreRootError``,
…); each also subclasses a builtin where one fits, so callers that know
nothing of Basalt can still catch it sensibly. What each answers a remote
caller is in the services' one table, ``basalt.services.errors``.
A record that does not decode is the record codec's
:class:`basalt.common.record.CorruptRecordError` (a ValueError: the SDK meets
it in a pull answer); the store raises its own subclass,
:class:`CorruptRecordError`, so ``except StoreError`` sees it too.
"""

from __future__ import annotations

from pathlib import Path

from basalt.common import record


class StoreError(Exception):
    """Base of every error the storage engine raises."""


class CorruptRecordError(StoreError, record.CorruptRecordError):
    """A CommitLog record that does not decode, at CommitLog offset ``offset``:
    the codec's error, raised by the store."""


class StoreConfigError(StoreError, ValueError):
    """A configuration value is out of range or inconsistent."""


class StoreLockedError(StoreError, RuntimeError):
    """Another process (or another store in this one) holds the root's lock file."""

    def __init__(self, root: Path) -> None:
        super().__init__(
            f"store root {root} is locked by another process: its 'lock' file is held; "
            "stop the other store or use a different root"
        )
        self.root = root


class StoreClosedError(StoreError, RuntimeError):
    """An operation needs a running store but the store is shut down."""


class CorruptFileError(StoreError, OSError):
    """A data file cannot be trusted: wrong size, bad name, or unreadable layout."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

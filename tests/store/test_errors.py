"""store.errors: one base for every exception class the engine defines."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import basalt.store
from basalt.common import record
from basalt.store import Message, MessageStore
from basalt.store.errors import CorruptRecordError, StoreError


def _exception_classes() -> list[type[BaseException]]:
    """Every exception class defined (not imported) by a module of basalt.store."""
    found: list[type[BaseException]] = []
    for info in pkgutil.iter_modules(basalt.store.__path__, "basalt.store."):
        module = importlib.import_module(info.name)
        found += [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == module.__name__
        ]
    return found


def test_the_engine_defines_exception_classes() -> None:
    names = {c.__name__ for c in _exception_classes()}
    # The walk finds them where they live, not only in store/errors.py.
    assert {"StoreClosedError", "Sql92ParseError", "InvalidOffsetRequestError"} <= names
    assert {"SemanticError", "StoreRootError", "UnknownFilterTypeError"} <= names


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: c.__qualname__)
def test_every_exception_class_of_the_engine_is_a_store_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, StoreError)


def test_a_record_that_does_not_decode_is_the_stores_error_at_its_commitlog_offset(
    store: MessageStore,
) -> None:
    store.put_messages([Message("T", b"first", queue_id=0), Message("T", b"second", queue_id=0)])
    second = store.put_messages([Message("T", b"third", queue_id=0)]).physical_offsets[0]
    mf = store.commitlog.files.find_by_offset(second)
    assert mf is not None
    mf.buffer[second - mf.file_from_offset + 4] ^= 0xFF  # its MAGICCODE
    with pytest.raises(CorruptRecordError) as raised:
        store.lookup_message_by_offset(second)
    # The store's own class: a StoreError, and still the codec's error (a ValueError).
    assert isinstance(raised.value, StoreError)
    assert isinstance(raised.value, record.CorruptRecordError)
    assert raised.value.offset == second
    assert f"commitlog offset {second}: bad magic code" in str(raised.value)

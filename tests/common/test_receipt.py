"""Receipt handles (basalt.common.receipt): round trips and malformed text."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from basalt.common.receipt import ReceiptHandle, ReceiptHandleError

HANDLE = ReceiptHandle("broker-a", "TopicA", 3, 42, 123_456, 2**61 + 5, 1_700_000_030_000, 30_000)

longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def test_round_trip_is_compact_and_url_safe() -> None:
    text = HANDLE.encode()
    assert ReceiptHandle.decode(text) == HANDLE
    assert len(text) <= 90  # 67 bytes
    assert set(text) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@given(
    broker=st.text(max_size=40),
    topic=st.text(max_size=127),
    queue_id=st.integers(min_value=0, max_value=2**31 - 1),
    offset=longs,
    physical=longs,
    nonce=longs,
    visible=longs,
    invisible=longs,
)
def test_any_handle_round_trips(
    broker: str,
    topic: str,
    queue_id: int,
    offset: int,
    physical: int,
    nonce: int,
    visible: int,
    invisible: int,
) -> None:
    h = ReceiptHandle(broker, topic, queue_id, offset, physical, nonce, visible, invisible)
    assert ReceiptHandle.decode(h.encode()) == h


@pytest.mark.parametrize(
    "text",
    ["", "!!!!", "abc", "a" * 10, "x" * 200_000, HANDLE.encode()[:-2], HANDLE.encode() + "AA"],
)
def test_garbage_raises_the_typed_error(text: str) -> None:
    with pytest.raises(ReceiptHandleError) as caught:
        ReceiptHandle.decode(text)
    assert isinstance(caught.value, ValueError)
    assert caught.value.handle == text


def test_any_flipped_byte_is_detected() -> None:
    raw = base64.urlsafe_b64decode(HANDLE.encode() + "==")
    for i in range(len(raw)):
        damaged = bytearray(raw)
        damaged[i] ^= 0x10
        text = base64.urlsafe_b64encode(bytes(damaged)).rstrip(b"=").decode()
        with pytest.raises(ReceiptHandleError):
            ReceiptHandle.decode(text)


def test_another_version_is_refused() -> None:
    raw = bytearray(base64.urlsafe_b64decode(HANDLE.encode() + "=="))
    raw[0] = 2
    with pytest.raises(ReceiptHandleError, match="version 2"):
        ReceiptHandle.decode(base64.urlsafe_b64encode(bytes(raw)).decode())


def test_out_of_range_fields_do_not_encode() -> None:
    with pytest.raises(ValueError):
        ReceiptHandle("b", "t", 2**31, 0, 0, 0, 0, 0).encode()

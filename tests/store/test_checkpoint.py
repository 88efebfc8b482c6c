"""store.checkpoint: the 4096-byte checkpoint file of three big-endian timestamps."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from basalt.store.checkpoint import CHECKPOINT_FILE_SIZE, RECOVERY_MARGIN_MS, StoreCheckpoint

PHYSIC, LOGICS, INDEX = 1_700_000_000_123, 1_700_000_000_456, 1_700_000_000_789


def test_a_new_checkpoint_is_a_4096_byte_file_of_zeroes(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    cp = StoreCheckpoint(path)
    try:
        assert CHECKPOINT_FILE_SIZE == 4096
        assert path.stat().st_size == 4096
        assert path.read_bytes() == bytes(4096)
        assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (
            0,
            0,
            0,
        )
    finally:
        cp.close()


def test_flush_writes_timestamps_big_endian_at_0_8_and_16(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    cp = StoreCheckpoint(path)
    try:
        cp.physic_msg_timestamp = PHYSIC
        cp.logics_msg_timestamp = LOGICS
        cp.index_msg_timestamp = INDEX
        assert path.read_bytes() == bytes(4096)  # setters stay in memory until flush
        cp.flush()
        data = path.read_bytes()
        assert len(data) == 4096
        assert data[0:8] == struct.pack(">q", PHYSIC)
        assert data[8:16] == struct.pack(">q", LOGICS)
        assert data[16:24] == struct.pack(">q", INDEX)
        assert data[0:8] == PHYSIC.to_bytes(8, "big")
        assert data[24:] == bytes(4096 - 24)
    finally:
        cp.close()


def test_flushed_timestamps_are_read_back_by_a_new_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    cp = StoreCheckpoint(path)
    cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp = (1, 2, 3)
    cp.flush()
    cp.physic_msg_timestamp = PHYSIC
    cp.close()  # close flushes too

    for read_only in (False, True):
        again = StoreCheckpoint(path, read_only=read_only)
        try:
            assert (
                again.physic_msg_timestamp,
                again.logics_msg_timestamp,
                again.index_msg_timestamp,
            ) == (PHYSIC, 2, 3)
        finally:
            again.close()


def test_a_checkpoint_written_by_hand_is_read(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(struct.pack(">qqq", PHYSIC, LOGICS, INDEX) + bytes(4096 - 24))
    cp = StoreCheckpoint(path)
    try:
        assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (
            PHYSIC,
            LOGICS,
            INDEX,
        )
    finally:
        cp.close()


@pytest.mark.parametrize(
    ("physic", "logics", "expected"),
    [
        (10_000, 20_000, 7_000),
        (20_000, 10_000, 7_000),
        (PHYSIC, LOGICS, PHYSIC - 3000),
        (3_000, 9_000, 0),
        (1_000, 5_000, 0),  # clamped at 0
        (0, 0, 0),
    ],
)
def test_min_timestamp_is_min_of_physic_and_logics_minus_3s_clamped_at_0(
    tmp_path: Path, physic: int, logics: int, expected: int
) -> None:
    cp = StoreCheckpoint(tmp_path / "checkpoint")
    try:
        cp.physic_msg_timestamp = physic
        cp.logics_msg_timestamp = logics
        cp.index_msg_timestamp = 1  # not part of min_timestamp_ms
        assert RECOVERY_MARGIN_MS == 3000
        assert cp.min_timestamp_ms() == expected
        assert cp.min_timestamp_index_ms() == min(expected, 1)
    finally:
        cp.close()


@pytest.mark.parametrize("size", [1, 24, 4095, 4097, 8192])
def test_a_checkpoint_of_the_wrong_size_is_reset_to_zero(
    tmp_path: Path, size: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a hint: a torn or padded checkpoint means "recover from the start", not
    "refuse to start"."""
    path = tmp_path / "checkpoint"
    path.write_bytes(b"\x01" * size)
    with caplog.at_level(logging.ERROR, "basalt.store.checkpoint"):
        cp = StoreCheckpoint(path)
    try:
        assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp) == (
            0,
            0,
            0,
        )
        assert cp.min_timestamp_ms() == 0
        assert f"size {size}" in caplog.text
    finally:
        cp.close()
    assert path.read_bytes() == bytes(4096)


def test_read_only_checkpoint_of_a_missing_file_is_zero_and_creates_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint"
    cp = StoreCheckpoint(path, read_only=True)
    cp.physic_msg_timestamp = PHYSIC
    cp.flush()
    cp.close()
    assert not path.exists()
    assert StoreCheckpoint(path, read_only=True).min_timestamp_ms() == 0


def test_read_only_checkpoint_never_writes(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    writer = StoreCheckpoint(path)
    writer.physic_msg_timestamp = 5
    writer.close()
    ro = StoreCheckpoint(path, read_only=True)
    ro.physic_msg_timestamp = 99
    ro.flush()
    ro.close()
    assert path.read_bytes()[:8] == struct.pack(">q", 5)

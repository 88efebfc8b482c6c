"""store.config: defaults, validation and immutability of MessageStoreConfig."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from basalt.common.record import MAX_PROPERTIES_SIZE, MAX_TOPIC_LENGTH
from basalt.store.config import (
    CQ_STORE_UNIT_SIZE,
    DEFAULT_CQ_UNITS_PER_FILE,
    FlushDiskType,
    MessageStoreConfig,
)
from basalt.store.errors import StoreConfigError, StoreError


def test_defaults_are_rocketmqs(tmp_path: Path) -> None:
    config = MessageStoreConfig(store_path_root_dir=tmp_path)
    assert config.mapped_file_size_commit_log == 1024 * 1024 * 1024
    assert config.mapped_file_size_consume_queue == 300_000 * 20
    assert config.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert config.flush_interval_commit_log_ms == 500
    assert config.max_message_size == 4 * 1024 * 1024
    assert config.check_crc_on_recover is True
    assert config.flush_interval_consume_queue_ms == 1000
    assert config.flush_commit_log_least_pages == 4
    assert config.flush_consume_queue_least_pages == 2
    assert config.sync_flush_timeout_ms == 5000


def test_format_constants() -> None:
    assert CQ_STORE_UNIT_SIZE == 20
    assert DEFAULT_CQ_UNITS_PER_FILE == 300_000
    assert MAX_PROPERTIES_SIZE == 32767
    assert MAX_TOPIC_LENGTH == 127
    assert FlushDiskType("SYNC_FLUSH") is FlushDiskType.SYNC_FLUSH


def test_root_may_be_a_string_and_derived_paths_follow_rocketmqs_layout(tmp_path: Path) -> None:
    config = MessageStoreConfig(store_path_root_dir=str(tmp_path))  # type: ignore[arg-type]
    assert config.store_path_root_dir == tmp_path
    assert config.commitlog_dir == tmp_path / "commitlog"
    assert config.consume_queue_dir == tmp_path / "consumequeue"
    assert config.checkpoint_path == tmp_path / "checkpoint"
    assert config.abort_path == tmp_path / "abort"
    assert config.lock_path == tmp_path / "lock"
    assert config.config_dir == tmp_path / "config"


def test_valid_overrides_are_kept(tmp_path: Path) -> None:
    config = MessageStoreConfig(
        store_path_root_dir=tmp_path,
        mapped_file_size_commit_log=4096,
        mapped_file_size_consume_queue=20,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        flush_commit_log_least_pages=0,
        store_host="[::1]:65535",
    )
    assert (config.mapped_file_size_commit_log, config.mapped_file_size_consume_queue) == (
        4096,
        20,
    )
    assert config.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert config.store_host == "[::1]:65535"


@pytest.mark.parametrize(
    "overrides",
    [
        {"mapped_file_size_commit_log": 4095},
        {"mapped_file_size_commit_log": 0},
        {"mapped_file_size_consume_queue": 0},
        {"mapped_file_size_consume_queue": 19},
        {"mapped_file_size_consume_queue": 300_000 * 20 + 1},
        {"mapped_file_size_consume_queue": -20},
        {"flush_interval_commit_log_ms": 0},
        {"flush_interval_commit_log_ms": -500},
        {"flush_interval_consume_queue_ms": 0},
        {"sync_flush_timeout_ms": 0},
        {"max_message_size": 0},
        {"reput_batch_size_bytes": 0},
        {"flush_commit_log_least_pages": -1},
        {"flush_consume_queue_least_pages": -1},
        {"store_host": "127.0.0.1"},
        {"store_host": "127.0.0.1:"},
        {"store_host": ":10911"},
        {"store_host": "127.0.0.1:port"},
        {"store_host": "127.0.0.1:65536"},
        {"store_host": "127.0.0.1:-1"},
        {"store_host": "999.0.0.1:10911"},
    ],
    ids=lambda overrides: ",".join(f"{k}={v}" for k, v in overrides.items()),
)
def test_invalid_values_raise_store_config_error(tmp_path: Path, overrides: dict[str, Any]) -> None:
    with pytest.raises(StoreConfigError) as excinfo:
        MessageStoreConfig(store_path_root_dir=tmp_path, **overrides)
    # Callers that know nothing of Basalt can still catch it.
    assert isinstance(excinfo.value, ValueError)
    assert isinstance(excinfo.value, StoreError)


def test_config_is_frozen(tmp_path: Path) -> None:
    config = MessageStoreConfig(store_path_root_dir=tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_message_size = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.store_path_root_dir = tmp_path / "other"  # type: ignore[misc]
    assert config.max_message_size == 4 * 1024 * 1024


def test_replace_validates_too(tmp_path: Path) -> None:
    config = MessageStoreConfig(store_path_root_dir=tmp_path)
    assert dataclasses.replace(config, max_message_size=1024).max_message_size == 1024
    with pytest.raises(StoreConfigError):
        dataclasses.replace(config, max_message_size=-1)


def test_config_fields_are_keyword_only(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        MessageStoreConfig(tmp_path)  # type: ignore[call-arg]

"""Every configuration class declares each of its fields once (basalt.common.settings).

The classes are found by name: every dataclass called ``*Config`` in the
basalt packages. Each must be listed in CONFIGS with what it needs to be built
and the error it raises, and every field of each must be a ``setting()``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pytest

from basalt.admin.service_main import AdminServiceProcessConfig
from basalt.client.consumer_base import ConsumerConfig
from basalt.client.lite_pull_consumer import LitePullConfig
from basalt.client.producer import ProducerConfig
from basalt.client.push_consumer import PushConsumerConfig
from basalt.common.settings import Setting, any_value, describe
from basalt.common.telemetry import TelemetryConfig
from basalt.common.tls import TlsConfig
from basalt.services.auth.config import AuthConfig
from basalt.services.meta.config import MetaConfig
from basalt.services.meta.errors import MetaValidationError
from basalt.services.meta.model import TopicConfig
from basalt.services.process import RuntimeConfig
from basalt.services.pull_service.main import PullServiceProcessConfig
from basalt.services.pull_service.service import PullServiceConfig
from basalt.services.rocketmq_v2.service import RocketMQv2Config
from basalt.services.store_node.ha.config import ReplicationConfig
from basalt.services.store_node.main import StoreNodeProcessConfig
from basalt.services.store_node.service import StoreNodeConfig
from basalt.store.config import MessageStoreConfig
from basalt.store.errors import StoreConfigError

#: Each configuration class: its required fields' values, and the error it raises.
CONFIGS: dict[type, tuple[dict[str, Any], type[Exception]]] = {
    MessageStoreConfig: ({"store_path_root_dir": Path("store")}, StoreConfigError),
    StoreNodeConfig: ({"broker_name": "broker-a"}, ValueError),
    ReplicationConfig: ({}, ValueError),
    PullServiceConfig: ({"pull_service_id": "pull-1"}, ValueError),
    MetaConfig: ({}, MetaValidationError),
    TopicConfig: ({"topic_name": "T"}, MetaValidationError),
    ProducerConfig: ({"producer_group": "P"}, ValueError),
    ConsumerConfig: ({"consumer_group": "G"}, ValueError),
    PushConsumerConfig: ({"consumer_group": "G"}, ValueError),
    LitePullConfig: ({"consumer_group": "G"}, ValueError),
    TelemetryConfig: ({"service_name": "basalt-test"}, ValueError),
    StoreNodeProcessConfig: ({}, ValueError),
    PullServiceProcessConfig: ({}, ValueError),
    AdminServiceProcessConfig: ({}, ValueError),
    RocketMQv2Config: ({}, ValueError),
    TlsConfig: ({}, ValueError),
    AuthConfig: ({}, ValueError),
    RuntimeConfig: ({}, ValueError),
}
PACKAGES = ("basalt.store", "basalt.services", "basalt.admin", "basalt.client", "basalt.common")


def _config_classes() -> set[type]:
    found = set()
    for package in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if info.name.endswith("__main__"):  # runs the CLI when imported
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if (
                    isinstance(value, type)
                    and dataclasses.is_dataclass(value)
                    and value.__module__ == module.__name__
                    and name.endswith("Config")
                ):
                    found.add(value)
    return found


def test_every_config_class_is_listed() -> None:
    assert _config_classes() == set(CONFIGS)


@pytest.mark.parametrize("cls", list(CONFIGS), ids=lambda cls: cls.__name__)
def test_every_field_is_declared_and_its_default_meets_its_rule(cls: type) -> None:
    required, _ = CONFIGS[cls]
    settings = describe(cls)  # TypeError for a field not declared with setting()
    assert [s.name for s in settings] == [f.name for f in dataclasses.fields(cls)]
    for s in settings:
        assert s.doc.strip() and s.rule, s.name
        if s.required:
            assert s.name in required
        else:
            default = s.default_factory() if s.default_factory else s.default
            assert s.check.failure(default) is None, s.name
        # A unit in the middle of a name is declared (``max_transfer_bytes_on_...``).
        for unit in ("ms", "s", "hours", "bytes"):
            if unit in s.name.split("_"):
                assert s.unit == unit, s.name
        # Every rule but "any value" refuses something.
        assert s.check is any_value or s.check.failure(object()) is not None, s.name
    cls(**required)


def _numeric_settings() -> list[tuple[type, Setting]]:
    return [
        (cls, s)
        for cls in CONFIGS
        for s in describe(cls)
        if s.type in (int, float) and s.check is not any_value
    ]


@pytest.mark.parametrize(
    ("cls", "setting"),
    _numeric_settings(),
    ids=lambda p: p.__name__ if isinstance(p, type) else p.name,
)
def test_a_bad_value_of_each_numeric_setting_is_refused_naming_it(
    cls: type, setting: Setting
) -> None:
    required, error = CONFIGS[cls]
    # -1 is refused, but where it means something (RocketMQ's
    # maxReconsumeTimes: its default): then -2.
    bad = -2 if setting.check.failure(-1) is None else -1
    failed = setting.check.failure(bad)
    assert failed is not None
    with pytest.raises(error) as excinfo:
        cls(**required, **{setting.name: bad})
    assert str(excinfo.value).endswith(f"{setting.name} must be {failed}, got {bad}")


def test_every_config_class_has_numeric_settings_checked_above() -> None:
    checked = {cls for cls, _ in _numeric_settings()}
    for cls in set(CONFIGS) - checked:
        # None of its settings is a number (RuntimeConfig: a choice of loop).
        assert not [s.name for s in describe(cls) if s.type in (int, float)], cls

"""basalt.common.settings: the checks, the one validating loop, describe()."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import pytest

from basalt.common.settings import (
    Check,
    any_value,
    at_least,
    between,
    boolean,
    check,
    config_dataclass,
    describe,
    from_validator,
    instance_of,
    integer,
    multiple_of,
    non_empty,
    non_negative,
    one_of,
    percentage,
    positive,
    setting,
    validate,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def _even(value: object) -> object:
    if not isinstance(value, int) or value % 2:
        raise ValueError(f"{value!r} is odd")
    return value


@pytest.mark.parametrize(
    ("rule", "good", "bad"),
    [
        (any_value, [None, 0, "x", object()], []),
        (boolean, [True, False], [0, 1, "true", None]),
        (integer, [0, -3, 10**20], [True, 1.0, "1", None]),
        (positive, [1, 0.5, 10**20], [0, -1, -0.5, True, "1", None, float("nan")]),
        (non_negative, [0, 0.0, 7], [-1, -0.1, False, "0"]),
        (percentage, [0, 40, 100, 99.5], [-1, 101, 100.5, True, "40"]),
        (non_empty, ["x", " "], ["", None, 0, b"x"]),
        (at_least(4096), [4096, 4097, 5000.0], [4095, 0, -1, "5000"]),
        (between(1, 1024), [1, 512, 1024], [0, 1025, -1, True, "5"]),
        (multiple_of(20), [0, 20, 6_000_000, -40], [19, 21, 20.0, "20", True]),
        (one_of(*Color), [Color.RED, Color.BLUE], ["red", "RED", None]),
        (one_of(1, "a"), [1, "a"], [2, "b"]),
        (instance_of(Path), [Path("x")], ["x", None]),
        (from_validator("even", _even), [0, 2, -4], [1, "2", None]),
        (check("'ip:port'", lambda v: isinstance(v, str) and ":" in v), ["a:1"], ["a", 1]),
    ],
    ids=lambda rule: rule.rule if isinstance(rule, Check) else None,
)
def test_each_check_allows_and_refuses(rule: Check, good: list[object], bad: list[object]) -> None:
    for value in good:
        assert rule.failure(value) is None, value
    for value in bad:
        assert rule.failure(value) == rule.rule, value


def test_rules_read_after_must_be() -> None:
    assert [r.rule for r in (positive, non_negative, percentage, boolean, non_empty)] == [
        "positive",
        "non-negative",
        "a percentage (0..100)",
        "true or false",
        "a non-empty string",
    ]
    assert at_least(2).rule == "at least 2"
    assert between(1, 1024).rule == "1..1024"
    assert multiple_of(20).rule == "a multiple of 20"
    assert one_of(*Color).rule == "one of RED, BLUE"
    assert one_of(1, "a").rule == "one of 1, 'a'"
    assert instance_of(Path).rule == "a Path"
    assert instance_of(Path, "a path").rule == "a path"


def test_a_combined_check_reports_the_first_part_that_fails() -> None:
    both = integer & between(1, 1024)
    assert both.rule == "an integer and 1..1024"
    assert both.failure(True) == "an integer"
    assert both.failure(0) == "1..1024"
    assert both.failure(8) is None


# -- the declaration and the loop ------------------------------------------------------


class SampleError(ValueError):
    pass


@config_dataclass
class Sample:
    """A configuration class as the code base writes them."""

    name: str = setting(check=non_empty, doc="Required: no default.")
    interval_ms: int = setting(default=500, check=positive, doc="How often.")
    batch: int = setting(default=32, check=integer & between(1, 1024), doc="Per pull.")
    max_message_size: int = setting(
        default=1024, check=positive, unit="bytes", doc="A unit the name does not carry."
    )
    tags: tuple[str, ...] = setting(default_factory=tuple, check=any_value, doc="Anything.")

    def __post_init__(self) -> None:
        validate(self, SampleError)


def test_config_dataclass_is_frozen_slotted_and_keyword_only() -> None:
    sample = Sample(name="n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.interval_ms = 1  # type: ignore[misc]
    assert not hasattr(sample, "__dict__")
    with pytest.raises(TypeError):
        Sample("n")  # type: ignore[misc]
    with pytest.raises(TypeError):
        Sample()  # type: ignore[call-arg]
    assert dataclasses.replace(sample, batch=8).batch == 8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": ""}, "name must be a non-empty string, got ''"),
        ({"interval_ms": 0}, "interval_ms must be positive, got 0"),
        ({"interval_ms": "5"}, "interval_ms must be positive, got '5'"),
        ({"batch": True}, "batch must be an integer, got True"),
        ({"batch": 2000}, "batch must be 1..1024, got 2000"),
    ],
)
def test_validate_raises_the_classes_error_naming_the_field(
    overrides: dict[str, Any], message: str
) -> None:
    values: dict[str, Any] = {"name": "n", **overrides}
    with pytest.raises(SampleError) as excinfo:
        Sample(**values)
    assert str(excinfo.value) == message


def test_validate_checks_fields_in_order_and_replace_too() -> None:
    with pytest.raises(SampleError, match=r"^name must be"):
        Sample(name="", interval_ms=0)
    with pytest.raises(SampleError, match=r"^interval_ms must be"):
        dataclasses.replace(Sample(name="n"), interval_ms=-1)


def test_where_goes_in_front_and_long_values_are_cut() -> None:
    sample = Sample(name="n")
    object.__setattr__(sample, "name", "")
    with pytest.raises(SampleError, match=r"^topic 'T': name must be a non-empty string, got ''$"):
        validate(sample, SampleError, where="topic 'T'")
    object.__setattr__(sample, "name", "n")
    object.__setattr__(sample, "interval_ms", "x" * 10_000)
    with pytest.raises(SampleError) as excinfo:
        validate(sample, SampleError)
    assert len(str(excinfo.value)) < 300 and str(excinfo.value).endswith("...")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Undeclared:
    declared: int = setting(default=1, check=positive, doc="Declared.")
    forgotten: int = 2


def test_a_field_without_a_declaration_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Undeclared\.forgotten is not declared with setting\(\)"):
        validate(Undeclared(), ValueError)
    with pytest.raises(TypeError, match=r"Undeclared\.forgotten"):
        describe(Undeclared)


def test_describe_gives_each_fields_declaration() -> None:
    settings = {s.name: s for s in describe(Sample)}
    assert list(settings) == ["name", "interval_ms", "batch", "max_message_size", "tags"]
    name, interval, batch = settings["name"], settings["interval_ms"], settings["batch"]
    assert name.required and name.default is dataclasses.MISSING and name.type is str
    assert (interval.type, interval.default, interval.unit) == (int, 500, "ms")
    assert (interval.doc, interval.rule, interval.check) == ("How often.", "positive", positive)
    assert not interval.required and interval.default_factory is None
    assert (batch.unit, batch.rule) == (None, "an integer and 1..1024")
    assert settings["max_message_size"].unit == "bytes"
    tags = settings["tags"]
    assert tags.type == tuple[str, ...] and tags.default_factory is tuple
    assert not tags.required and tags.rule == "any value"


@pytest.mark.parametrize(
    ("name", "unit"),
    [
        ("flush_interval_commit_log_ms", "ms"),
        ("lease_ttl_s", "s"),
        ("file_reserved_time_hours", "hours"),
        ("reput_batch_size_bytes", "bytes"),
        ("flush_commit_log_least_pages", "pages"),
        ("disk_max_used_space_ratio", "%"),
        ("max_index_num", None),
        ("orderly", None),
    ],
)
def test_the_unit_is_read_from_the_name(name: str, unit: str | None) -> None:
    cls = dataclasses.make_dataclass(
        "One", [(name, int, setting(default=1, check=any_value, doc="."))]
    )
    assert describe(cls)[0].unit == unit

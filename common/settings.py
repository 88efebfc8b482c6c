"""Settings declared once: each configuration field names its default, rule and doc.

Kafka's ``ConfigDef.define(name, type, default, validator, doc)`` and grpclib's
``field(metadata={'validate': ...})`` in one small form. A configuration class
is a frozen, slotted, keyword-only dataclass made by :func:`config_dataclass`,
and every field is a :func:`setting`::

    @config_dataclass
    class ProducerConfig:
        producer_group: str = setting(check=non_empty, doc="RocketMQ's producerGroup.")
        send_msg_timeout_ms: int = setting(
            default=3000, check=positive, doc="A send's deadline, retries included."
        )

        def __post_init__(self) -> None:
            validate(self, ValueError)

A class's ``__post_init__`` does, in this order: bring the other forms a field
accepts to its declared type (a ``str`` path, ``"h1:2379,h2:2379"``), then
:func:`validate` - the one loop, which refuses the first field whose value
breaks its rule with ``"<name> must be <rule>, got <value>"`` in the class's
own exception type - then any rule that spans fields. :func:`validate` raises
:class:`TypeError` for a field declared without :func:`setting`, so a field
cannot be added unchecked. :func:`describe` gives each field's name, type,
default, unit, doc and rule, for the docs and a ``--print-config``.

A :class:`Check` is a rule's text (what follows "must be") and a predicate;
``a & b`` checks ``a`` then ``b`` and reports the first that fails. Numeric
checks refuse ``bool`` and anything that is not an ``int`` or ``float``.

Standard library only: the SDK uses it too.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")

#: The key of a field's declaration in its ``dataclasses.field`` metadata.
_KEY = "basalt.setting"
#: Units read from a field's name (RocketMQ's names carry them: ``*_ms``,
#: ``file_reserved_time_hours``, ``*_ratio`` in percent).
_UNIT_SUFFIXES = (
    ("_ms", "ms"),
    ("_s", "s"),
    ("_hours", "hours"),
    ("_bytes", "bytes"),
    ("_pages", "pages"),
    ("_ratio", "%"),
)
#: Longest shown value in a refusal; a bad value can be a whole file's text.
_MAX_SHOWN = 200


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """A rule a setting's value must meet: ``(rule text, predicate)`` parts, all
    of which must hold. The text completes "<name> must be …"."""

    parts: tuple[tuple[str, Callable[[Any], bool]], ...]

    @property
    def rule(self) -> str:
        """The whole rule, as :func:`describe` shows it."""
        return " and ".join(text for text, _ in self.parts)

    def failure(self, value: object) -> str | None:
        """The text of the first part ``value`` breaks, or None if it meets them all."""
        for text, test in self.parts:
            if not test(value):
                return text
        return None

    def __and__(self, other: Check) -> Check:
        return Check(self.parts + other.parts)


def check(rule: str, test: Callable[[Any], bool]) -> Check:
    """A custom rule: ``test(value)`` is true when ``value`` is allowed; ``rule``
    completes "<name> must be …" (e.g. ``"'ip:port'"``)."""
    return Check(((rule, test),))


def from_validator(rule: str, validator: Callable[[Any], object]) -> Check:
    """A rule kept by an existing function that raises ValueError (or TypeError)
    on a bad value, so the rule is written once; ``rule`` describes it."""

    def test(value: object) -> bool:
        try:
            validator(value)
        except (ValueError, TypeError):
            return False
        return True

    return check(rule, test)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: Anything: for a field whose every value is meaningful.
any_value = check("any value", lambda value: True)
#: ``True`` or ``False``, nothing that merely converts to one.
boolean = check("true or false", lambda value: isinstance(value, bool))
#: An ``int`` (not a ``bool``).
integer = check("an integer", _is_integer)
#: A number above zero.
positive = check("positive", lambda value: _is_number(value) and value > 0)
#: A number, zero or above.
non_negative = check("non-negative", lambda value: _is_number(value) and value >= 0)
#: A number in 0..100.
percentage = check("a percentage (0..100)", lambda value: _is_number(value) and 0 <= value <= 100)
#: A ``str`` with at least one character.
non_empty = check("a non-empty string", lambda value: isinstance(value, str) and value != "")


def at_least(minimum: int | float) -> Check:
    """A number ``>= minimum``."""
    return check(f"at least {minimum}", lambda value: _is_number(value) and value >= minimum)


def between(low: int | float, high: int | float) -> Check:
    """A number in ``low..high``, both included."""
    return check(f"{low}..{high}", lambda value: _is_number(value) and low <= value <= high)


def multiple_of(unit: int) -> Check:
    """An integer that ``unit`` divides (zero is one; combine with :data:`positive`)."""
    return check(f"a multiple of {unit}", lambda value: _is_integer(value) and value % unit == 0)


def one_of(*choices: object) -> Check:
    """One of ``choices`` (enum members are shown by name)."""
    shown = ", ".join(str(getattr(c, "name", None) or repr(c)) for c in choices)
    return check(f"one of {shown}", lambda value: value in choices)


def instance_of(kind: type, rule: str | None = None) -> Check:
    """An instance of ``kind``; the rule reads ``"a <kind name>"`` unless given."""
    return check(rule or f"a {kind.__name__}", lambda value: isinstance(value, kind))


@dataclasses.dataclass(frozen=True, slots=True)
class _Declaration:
    """What :func:`setting` puts in a field's metadata."""

    check: Check
    doc: str
    unit: str | None


@overload
def setting(*, default: T, check: Check, doc: str, unit: str | None = None) -> T: ...
@overload
def setting(
    *, default_factory: Callable[[], T], check: Check, doc: str, unit: str | None = None
) -> T: ...
@overload
def setting(*, check: Check, doc: str, unit: str | None = None) -> Any: ...
def setting(
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
    check: Check,
    doc: str,
    unit: str | None = None,
) -> Any:
    """One configuration field: its default (or ``default_factory``; neither: the
    field is required), the rule its value must meet, and its documentation.

    ``unit`` is read from the name (``_ms``, ``_s``, ``_hours``, ``_bytes``,
    ``_pages``, ``_ratio``: percent) unless given, for names RocketMQ left
    without one (``max_message_size``: bytes)."""
    declaration = _Declaration(check=check, doc=doc, unit=unit)
    metadata = {_KEY: declaration}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass_transform(
    frozen_default=True, kw_only_default=True, field_specifiers=(setting, dataclasses.field)
)
def config_dataclass(cls: type[T]) -> type[T]:
    """``@dataclass(frozen=True, slots=True, kw_only=True)``, marked so that type
    checkers read :func:`setting` as a field (a required setting stays required)."""
    return dataclasses.dataclass(frozen=True, slots=True, kw_only=True)(cls)


def _declaration(owner: type, field: dataclasses.Field[Any]) -> _Declaration:
    declaration = field.metadata.get(_KEY)
    if not isinstance(declaration, _Declaration):
        raise TypeError(f"{owner.__name__}.{field.name} is not declared with setting()")
    return declaration


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def validate(instance: object, error: Callable[[str], Exception], *, where: str = "") -> None:
    """Check every field of the dataclass ``instance`` against its declared rule,
    in field order.

    Raises ``error("<name> must be <rule>, got <value!r>")`` for the first value
    that breaks its rule (``where``, if given, is put in front: ``"topic 'T': …"``),
    and TypeError if a field is not declared with :func:`setting`.
    """
    owner = type(instance)
    for field in dataclasses.fields(owner):  # type: ignore[arg-type]
        value = getattr(instance, field.name)
        refused = refusal(field.name, _declaration(owner, field).check, value)
        if refused is not None:
            prefix = f"{where}: " if where else ""
            raise error(prefix + refused)


def refusal(name: str, rule: Check, value: object) -> str | None:
    """``"<name> must be <rule>, got <value!r>"`` when ``value`` breaks ``rule``
    (the part it breaks), else None: :func:`validate`'s message for one field."""
    failed = rule.failure(value)
    return None if failed is None else f"{name} must be {failed}, got {_shown(value)}"


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One declared field, as :func:`describe` gives it."""

    name: str
    #: The field's annotation, resolved (``int``, ``tuple[str, ...]``, an enum).
    type: object
    #: ``dataclasses.MISSING`` when the field has no default (see ``default_factory``).
    default: object
    #: Makes the default per instance (e.g. a client id); None for a plain default.
    default_factory: Callable[[], object] | None
    #: From the name or the declaration; None for a count, a name, a flag.
    unit: str | None
    doc: str
    check: Check

    @property
    def rule(self) -> str:
        return self.check.rule

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING and self.default_factory is None


def _unit_of(name: str) -> str | None:
    return next((unit for suffix, unit in _UNIT_SUFFIXES if name.endswith(suffix)), None)


def describe(cls: type) -> tuple[Setting, ...]:
    """Every field of the configuration class ``cls``, in field order.

    Raises TypeError if a field is not declared with :func:`setting`.
    """
    hints = typing.get_type_hints(cls)
    return tuple(_setting(cls, field, hints) for field in dataclasses.fields(cls))


def _setting(cls: type, field: dataclasses.Field[Any], hints: dict[str, object]) -> Setting:
    declaration = _declaration(cls, field)
    factory = field.default_factory
    return Setting(
        name=field.name,
        type=hints[field.name],
        default=field.default,
        default_factory=None if factory is dataclasses.MISSING else factory,
        unit=declaration.unit or _unit_of(field.name),
        doc=declaration.doc,
        check=declaration.check,
    )

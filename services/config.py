"""A service's settings from four layers: flag > env > file > default.

A service declares its settings as :class:`Section` s, each a config
dataclass (:mod:`basalt.common.settings`: every field carries its type,
default, rule and doc). From them come, for each field under its public name
(the field's name, or an alias that keeps a flag of old: ``broker_name`` is
``name``):

==========  ===============================================================
layer       form
==========  ===============================================================
flag        ``--kebab-name VALUE`` (a bool also alone: ``--message-index-enable``)
env         ``BASALT_UPPER_SNAKE`` (the flag's name upper-cased, ``-`` -> ``_``)
file        ``--config FILE`` or env ``BASALT_CONFIG``: RocketMQ's broker.conf
default     the dataclass's (or the section's, where a service differs, said in its doc)
==========  ===============================================================

The file is ``key=value`` lines, ``#``/``!`` comments and blank lines. A key
is a setting's public or field name in snake_case, or its camelCase form as
RocketMQ writes it (``mappedFileSizeCommitLog``, ``flushDiskType``), or one of
RocketMQ's names that differ after camel->snake (:data:`ROCKETMQ_NAMES`:
``fileReservedTime``, ``brokerClusterName`` ...). RocketMQ broker keys Basalt
has no use for (:data:`ROCKETMQ_IGNORED`: ``brokerId``, ``namesrvAddr`` ...)
are reported as ignored; any other key is an error naming the file's line.

Every value from a flag, env or file is text, parsed by the field's type
(``int``, ``float``, ``bool`` as ``true``/``false``, ``str``, ``Path``, an
enum by name, ``tuple[str, ...]`` as a comma list, ``int | None`` with
``none`` or empty for None); then the dataclass validates it. Either failure
raises :class:`ConfigError` naming the setting and where the value came from:
``file_reserved_time_hours must be non-negative, got -1 (from env
BASALT_FILE_RESERVED_TIME_HOURS)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from basalt.common.settings import (
    Check,
    Setting,
    check,
    describe,
    positive,
    refusal,
    setting,
)

T = TypeVar("T")

#: The env var naming a config file when ``--config`` is not given.
CONFIG_ENV = "BASALT_CONFIG"
ENV_PREFIX = "BASALT_"

#: RocketMQ's broker.conf names that do not become Basalt's after camel->snake
#: (units Basalt puts in the name, RocketMQ's "Maped" spelling, acronyms).
ROCKETMQ_NAMES: Mapping[str, str] = {
    "brokerClusterName": "cluster",
    "storePathRootDir": "store_path_root_dir",
    "fileReservedTime": "file_reserved_time_hours",
    "mapedFileSizeCommitLog": "mapped_file_size_commit_log",
    "mapedFileSizeConsumeQueue": "mapped_file_size_consume_queue",
    "flushIntervalCommitLog": "flush_interval_commit_log_ms",
    "flushCommitLogThoroughInterval": "flush_commit_log_thorough_interval_ms",
    "flushIntervalConsumeQueue": "flush_interval_consume_queue_ms",
    "flushConsumeQueueThoroughInterval": "flush_consume_queue_thorough_interval_ms",
    "syncFlushTimeout": "sync_flush_timeout_ms",
    "checkCRCOnRecover": "check_crc_on_recover",
    "enabledAppendPropCRC": "enabled_append_prop_crc",
    "flushConsumerOffsetInterval": "flush_consumer_offset_interval_ms",
    "cleanResourceInterval": "clean_resource_interval_ms",
    "deleteCommitLogFilesInterval": "delete_commit_log_files_interval_ms",
    "destroyMapedFileIntervalForcibly": "destroy_mapped_file_interval_forcibly_ms",
    "destroyMappedFileIntervalForcibly": "destroy_mapped_file_interval_forcibly_ms",
}

#: RocketMQ broker.conf keys Basalt has no use for: a broker.conf brought over
#: loads, and each of these is reported (logged at WARNING at start, listed by
#: ``--print-config``). RocketMQ 4's master/slave roles and HA addresses
#: (Basalt's groups elect through etcd: docs/replication.md), the name
#: server (etcd), per-subdirectory paths (all under the store root), thread
#: pools, RocketMQ's own features; ``listenPort`` and ``brokerIP1``: Basalt
#: takes whole addresses (``listen``, ``advertise_address``).
ROCKETMQ_IGNORED = frozenset(
    {
        "brokerRole",
        "brokerIP1",
        "brokerIP2",
        "brokerPermission",
        "namesrvAddr",
        "fetchNamesrvAddrByAddressServer",
        "listenPort",
        "haListenPort",
        "haMasterAddress",
        "haSendHeartbeatInterval",
        "storePathCommitLog",
        "storePathConsumeQueue",
        "storePathIndex",
        "storeCheckpoint",
        "abortFile",
        "sendMessageThreadPoolNums",
        "pullMessageThreadPoolNums",
        "useReentrantLockWhenPutMessage",
        "waitTimeMillsInSendQueue",
        "osPageCacheBusyTimeOutMills",
        "transientStorePoolEnable",
        "warmMapedFileEnable",
        "flushLeastPagesWhenWarmMapedFile",
        "enableDLegerCommitLog",
        "slaveReadEnable",
        "aclEnable",
        "traceTopicEnable",
        "autoCreateSubscriptionGroup",
        "enablePropertyFilter",
        "rejectTransactionMessage",
        "transactionCheckInterval",
        "duplicationEnable",
        "mappedFileSizeTimerLog",
        "timerWheelEnable",
        "storeType",
    }
)

_COMMENT = ("#", "!")


def _is_host_port(value: object, *, port_zero: bool) -> bool:
    if not isinstance(value, str):
        return False
    host, sep, port = value.rpartition(":")
    lowest = 0 if port_zero else 1
    return bool(sep and host) and " " not in host and port.isdigit() and lowest <= int(port) < 65536


#: Hosts that bind every interface: not an address to give anyone.
WILDCARD_HOSTS = ("", "0.0.0.0", "[::]", "::")


def reachable_host(address: str) -> str:
    """The host of ``address`` (``host:port``) others can dial: a wildcard is
    reachable on loopback at least (give an advertised address otherwise)."""
    host = address.rpartition(":")[0]
    return "127.0.0.1" if host in WILDCARD_HOSTS else host


#: An address to bind: ``host:port``, port 0 picking a free one.
listen_address: Check = check(
    "host:port (port 0..65535)", lambda v: _is_host_port(v, port_zero=True)
)
#: An address to bind, or empty for "not served".
listen_address_or_empty: Check = check(
    "host:port (port 0..65535) or empty", lambda v: v == "" or _is_host_port(v, port_zero=True)
)
#: An address others dial, or empty for "derived from another setting".
address_or_empty: Check = check(
    "host:port or empty", lambda v: v == "" or _is_host_port(v, port_zero=False)
)


class ConfigError(ValueError):
    """A setting's value is missing, does not parse or breaks its rule; the
    message names the setting and the value's source."""


class _Unset:
    """The value of a required setting no layer gives, where that is allowed
    (``--print-config``: :func:`resolve` with ``missing_ok``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


#: A required setting left unset (shown by ``--print-config``; never built).
UNSET = _Unset()
#: Its source in :class:`Value`.
UNSET_SOURCE = "required"


@dataclasses.dataclass(frozen=True, slots=True)
class Section:
    """One config dataclass a service takes its settings for.

    ``aliases`` maps a field to its public name (flag, env and file key) where
    that is not the field's own name. ``hidden`` fields are set by the program
    (passed to :meth:`Resolved.build`), never by a user. ``defaults`` replace
    the dataclass's default for this service (a reason belongs in the
    service's doc). ``enabled_by``: the section is in use only when that
    setting is given (a store-node without ``etcd`` runs without etcd)."""

    cls: type
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    hidden: frozenset[str] = frozenset()
    defaults: Mapping[str, object] = dataclasses.field(default_factory=dict)
    enabled_by: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Option:
    """One user-settable field: where it lives and the names it goes by."""

    section: Section
    setting: Setting
    #: The public snake_case name: the file key, and the flag's and env's stem.
    name: str

    @property
    def field(self) -> str:
        return self.setting.name

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def default(self) -> object:
        """This service's default (``dataclasses.MISSING``: the setting is required)."""
        if self.field in self.section.defaults:
            return self.section.defaults[self.field]
        if self.setting.default_factory is not None:
            return self.setting.default_factory()
        return self.setting.default


@dataclasses.dataclass(frozen=True, slots=True)
class Derived:
    """A setting whose default is computed from others once every layer is
    read: ``compute(values)`` (values by public name) gives it when no layer
    set it; ``from_`` says from what, for ``--print-config``."""

    name: str
    compute: Callable[[Mapping[str, object]], object]
    from_: str


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A service's sections and derived defaults; ``prog`` names it in messages."""

    prog: str
    sections: tuple[Section, ...]
    derived: tuple[Derived, ...] = ()

    def options(self) -> tuple[Option, ...]:
        """Every settable field, in section then field order.

        Raises TypeError when two sections give the same public name."""
        options: list[Option] = []
        seen: set[str] = set()
        for section in self.sections:
            for s in describe(section.cls):
                if s.name in section.hidden:
                    continue
                option = Option(section, s, section.aliases.get(s.name, s.name))
                if option.name in seen:
                    raise TypeError(f"{self.prog}: setting {option.name!r} declared twice")
                seen.add(option.name)
                options.append(option)
        return tuple(options)

    def with_sections(self, *sections: Section) -> ServiceSpec:
        return dataclasses.replace(self, sections=self.sections + sections)


@dataclasses.dataclass(frozen=True, slots=True)
class Value:
    """A setting's effective value and where it came from: ``default``,
    ``file:PATH:LINE``, ``env:BASALT_X`` or ``flag:--x``; a required one no
    layer gave (``--print-config`` only): :data:`UNSET` from
    :data:`UNSET_SOURCE`."""

    value: object
    source: str


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    """The effective settings of one service: each option's value and source,
    and the file keys ignored (``"key (file:PATH:LINE)"``)."""

    spec: ServiceSpec
    values: Mapping[str, Value]
    ignored: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> object:
        return self.values[name].value

    def given(self, name: str) -> bool:
        """Whether a flag, env var or file set ``name`` (a derived value is not given)."""
        return not self.values[name].source.startswith("default")

    def enabled(self, section: Section) -> bool:
        return section.enabled_by is None or self.given(section.enabled_by)

    def unset(self) -> list[str]:
        """The required settings no layer gave (only ``--print-config`` resolves so)."""
        return [name for name, v in self.values.items() if v.value is UNSET]

    def _options(self, section: Section) -> list[Option]:
        return [o for o in self.spec.options() if o.section is section]

    def build(self, cls: type[T], **hidden: object) -> T:
        """The ``cls`` section's dataclass from the effective values (``hidden``
        fills the fields the program sets). Raises ConfigError naming the
        setting and its source when the dataclass refuses a value, or naming
        a required setting left unset."""
        section = next(s for s in self.spec.sections if s.cls is cls)
        options = self._options(section)
        for option in options:
            if self.values[option.name].value is UNSET:
                raise ConfigError(_required(option))
        kwargs = {o.field: self.values[o.name].value for o in options} | hidden
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ConfigError(self._with_source(str(e), options)) from None

    def _with_source(self, message: str, options: Iterable[Option]) -> str:
        # The dataclass's message starts with the field's name (settings.validate).
        match = re.match(r"\w+", message)
        for option in options:
            if match is not None and match.group() == option.field:
                return f"{message} ({_source_text(self.values[option.name].source)})"
        return message

    def check(self, **hidden: Mapping[str, object]) -> None:
        """Build every enabled section once, so a bad value fails here, before
        anything starts; ``hidden`` by class name. A section with a required
        setting left :data:`UNSET` cannot be built: each of its other values
        is checked against its own rule instead. Raises ConfigError."""
        for section in self.spec.sections:
            if not self.enabled(section):
                continue
            options = self._options(section)
            if all(self.values[o.name].value is not UNSET for o in options):
                self.build(section.cls, **hidden.get(section.cls.__name__, {}))
                continue
            for option in options:
                value = self.values[option.name].value
                refused = (
                    None if value is UNSET else refusal(option.field, option.setting.check, value)
                )
                if refused is not None:
                    raise ConfigError(self._with_source(refused, [option]))

    def table(self) -> list[tuple[str, str, str]]:
        """``(name, value, source)`` of every setting, for ``--print-config``."""
        return [(name, show(v.value), v.source) for name, v in self.values.items()]


def _required(option: Option) -> str:
    return (
        f"{option.name} is required: give {option.flag}, env {option.env} "
        f"or the key {option.name} in a --config file"
    )


def _source_text(source: str) -> str:
    kind, _, where = source.partition(":")
    return f"from {kind} {where}" if where else f"the {kind}"


def stop_grace_setting() -> Any:
    """Every service's ``stop_grace_s``, declared once: a process config
    dataclass's field (``stop_grace_s: float = stop_grace_setting()``)."""
    return setting(
        default=5.0,
        check=positive,
        doc="On SIGTERM, in-flight calls get this long to finish before they are "
        "cancelled (a deployment's termination grace period must be longer).",
    )


# -- the command line ---------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, spec: ServiceSpec) -> None:
    """A flag per option of ``spec`` (its value kept as text, absent when not
    given, so the other layers can show through); remembers ``spec`` on the
    parsed namespace (``service_spec``) for :func:`resolve_args`."""
    add_flags(parser, spec.options())
    parser.set_defaults(service_spec=spec)


def add_flags(parser: argparse.ArgumentParser, options: Iterable[Option]) -> None:
    """A flag per option, ``--kebab-name``, its help the setting's doc, rule and default."""
    for option in options:
        kind = option.setting.type
        default = option.default
        shown = "required" if default is dataclasses.MISSING else f"default {show(default)}"
        if shown == "default ":
            shown = "default empty"
        extra: dict[str, Any] = {"metavar": _metavar(kind)}
        if kind is bool:
            extra |= {"nargs": "?", "const": "true"}
        parser.add_argument(
            option.flag,
            dest=option.name,
            default=argparse.SUPPRESS,
            help=f"{option.setting.doc} Must be {option.setting.rule}; {shown} "
            f"(env {option.env}).".replace("%", "%%"),
            **extra,
        )


def _metavar(kind: object) -> str:
    if kind is bool:
        return "true|false"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "|".join(kind.__members__)
    if typing.get_origin(kind) is tuple:
        return "A,B,..."
    names = {int: "N", float: "X", Path: "PATH"}
    return next((v for k, v in names.items() if k is kind), "TEXT" if kind is str else "N|none")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--print-config``."""
    parser.add_argument(
        "--config",
        dest="config_file",
        type=Path,
        default=None,
        help=f"a broker.conf-style settings file (key=value; env {CONFIG_ENV})",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print every effective setting, its value and its source, and exit",
    )


def resolve_args(
    spec: ServiceSpec,
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    *,
    missing_ok: bool = False,
) -> Resolved:
    """:func:`resolve` with the flags parsed into ``args`` and the file it or
    the environment names. Raises ConfigError."""
    environ = os.environ if environ is None else environ
    flags = {o.name: getattr(args, o.name) for o in spec.options() if hasattr(args, o.name)}
    path = getattr(args, "config_file", None)
    if path is None and environ.get(CONFIG_ENV):
        path = Path(environ[CONFIG_ENV])
    return resolve(spec, flags=flags, environ=environ, config_file=path, missing_ok=missing_ok)


# -- the layers ---------------------------------------------------------------------------


def resolve(
    spec: ServiceSpec,
    *,
    flags: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    missing_ok: bool = False,
) -> Resolved:
    """Each option's value from the strongest layer that has it: ``flags`` (by
    public name), ``environ`` (``BASALT_*``), ``config_file``, the default;
    then the spec's derived defaults. Values are parsed by type here; the
    dataclasses' own rules are checked by :meth:`Resolved.build`.

    Raises ConfigError for a value that does not parse, a required setting no
    layer gives (unless ``missing_ok``: it is then :data:`UNSET`, for
    ``--print-config``), an unreadable file, a file line that is not
    ``key=value`` or an unknown key in it."""
    options = spec.options()
    flags = flags or {}
    environ = environ or {}
    from_file, ignored = ({}, ()) if config_file is None else read_file(config_file, options)
    values: dict[str, Value] = {}
    for option in options:
        layers = (
            (flags.get(option.name), f"flag:{option.flag}"),
            # An empty env var is unset (OpenTelemetry's rule; compose files set them so).
            (environ.get(option.env) or None, f"env:{option.env}"),
            from_file.get(option.name, (None, "")),
        )
        text, source = next(((t, s) for t, s in layers if t is not None), (None, "default"))
        if text is not None:
            values[option.name] = Value(parse(option, text, source), source)
        elif option.default is dataclasses.MISSING:
            if not missing_ok:
                raise ConfigError(_required(option))
            values[option.name] = Value(UNSET, UNSET_SOURCE)
        else:
            values[option.name] = Value(option.default, "default")
    for derived in spec.derived:
        # From an unset required setting (--print-config) nothing is derived.
        if values[derived.name].source == "default" and values[derived.from_].value is not UNSET:
            values[derived.name] = Value(
                derived.compute({n: v.value for n, v in values.items()}),
                f"default (from {derived.from_})",
            )
    return Resolved(spec, values, ignored)


def file_keys(options: Iterable[Option]) -> dict[str, str]:
    """Every key a file may set an option by, to the option's public name."""
    keys: dict[str, str] = {}
    by_field = {}
    for option in options:
        by_field[option.field] = option.name
        for key in {option.name, option.field, camel(option.name), camel(option.field)}:
            keys[key] = option.name
    for rocketmq, field in ROCKETMQ_NAMES.items():
        if field in by_field:
            keys[rocketmq] = by_field[field]
        elif field in keys.values():
            keys[rocketmq] = field
    return keys


def read_file(
    path: Path, options: Iterable[Option]
) -> tuple[dict[str, tuple[str, str]], tuple[str, ...]]:
    """The settings a broker.conf-style file gives: ``{name: (text, source)}``
    and the RocketMQ keys it ignores. A key given twice: the later line wins,
    as in Java's Properties. Raises ConfigError (with ``PATH:LINE``)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path}: {e}") from None
    keys = file_keys(options)
    found: dict[str, tuple[str, str]] = {}
    ignored: list[str] = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        where = f"{path}:{number}"
        if not stripped or stripped.startswith(_COMMENT):
            continue
        key, sep, text = stripped.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{where}: expected key=value, got {stripped!r}")
        if key in keys:
            found[keys[key]] = (text.strip(), f"file:{where}")
        elif key in ROCKETMQ_IGNORED:
            ignored.append(f"{key} (file:{where})")
        else:
            raise ConfigError(f"{where}: unknown setting {key!r}")
    return found, tuple(ignored)


def camel(name: str) -> str:
    """``mapped_file_size_commit_log`` -> ``mappedFileSizeCommitLog``."""
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)


# -- values -------------------------------------------------------------------------------


def parse(option: Option, text: str, source: str) -> object:
    """``text`` as the option's type. Raises ConfigError naming the option and ``source``."""
    try:
        return parse_as(option.setting.type, text)
    except ValueError as e:
        raise ConfigError(
            f"{option.name} must be {e}, got {text!r} ({_source_text(source)})"
        ) from None


def parse_as(kind: object, text: str) -> object:
    """``text`` as ``kind``; ValueError's message completes "must be …"."""
    text = text.strip()
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError("true or false")
        return text.lower() == "true"
    if kind is int:
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise ValueError("an integer") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("a number") from None
    if kind is str:
        return text
    if kind is Path:
        return Path(text)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind[text.upper()]
        except KeyError:
            raise ValueError("one of " + ", ".join(kind.__members__)) from None
    origin, params = typing.get_origin(kind), typing.get_args(kind)
    if origin is tuple and params[1:] == (Ellipsis,):
        return tuple(parse_as(params[0], part) for part in text.split(",") if part.strip())
    if origin in (typing.Union, types.UnionType) and type(None) in params:
        if text.lower() in ("", "none"):
            return None
        (inner,) = (p for p in params if p is not type(None))
        return parse_as(inner, text)
    raise TypeError(f"no parser for settings of type {kind!r}")


def show(value: object) -> str:
    """A value as it would be written in a file (the inverse of :func:`parse_as`);
    :data:`UNSET` as ``(unset)``."""
    if value is UNSET:
        return "(unset)"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, tuple):
        return ",".join(show(v) for v in value)
    return str(value)


def docs_table(spec: ServiceSpec) -> str:
    """A Markdown table of every setting of ``spec``: name, flag and env,
    default, unit, rule and doc (docs/configuration.md holds one per service)."""
    rows = [
        "| setting | flag / env | default | unit | must be | what |",
        "|---|---|---|---|---|---|",
    ]
    for option in spec.options():
        default = option.default
        shown = "(required)" if default is dataclasses.MISSING else f"`{show(default)}`"
        if shown == "``":
            shown = "(empty)"
        derived = next((d for d in spec.derived if d.name == option.name), None)
        if derived is not None:
            shown = f"from `{derived.from_}`"
        cells = (option.setting.unit or "", option.setting.rule, option.setting.doc)
        unit, rule, doc = (cell.replace("|", "\\|") for cell in cells)
        rows.append(
            f"| `{option.name}` | `{option.flag}` `{option.env}` | {shown} "
            f"| {unit} | {rule} | {doc} |"
        )
    return "\n".join(rows) + "\n"


def render_docs(text: str, specs: Mapping[str, ServiceSpec]) -> str:
    """``text`` with each block between ``<!-- settings: NAME -->`` and
    ``<!-- end settings -->`` replaced by :func:`docs_table` of ``specs[NAME]``."""

    def table(match: re.Match[str]) -> str:
        return f"{match.group(1)}\n{docs_table(specs[match.group(2)])}{match.group(3)}"

    return re.sub(
        r"(<!-- settings: ([\w-]+) -->)\n.*?(<!-- end settings -->)", table, text, flags=re.S
    )


def format_table(resolved: Resolved) -> str:
    """``--print-config``'s output: a column each for name, value and source,
    then the ignored file keys."""
    rows = [("setting", "value", "source"), *resolved.table()]
    widths = [max(len(row[i]) for row in rows) for i in (0, 1)]
    lines = [f"{n:<{widths[0]}}  {v:<{widths[1]}}  {s}".rstrip() for n, v, s in rows]
    lines.extend(f"ignored: {key}" for key in resolved.ignored)
    return "\n".join(lines) + "\n"

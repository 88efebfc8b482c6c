"""Message filters for the store's pull path: RocketMQ's ``ExpressionMessageFilter``.

The pull loop asks a filter two questions per ConsumeQueue entry, cheapest
first, exactly as RocketMQ's ``DefaultMessageStore.getMessage`` does:

1. :meth:`MessageFilter.is_matched_by_consume_queue` with the entry's tagsCode
   (the 8-byte ``Tag HashCode`` of the 20-byte CQ unit): no CommitLog read.
2. :meth:`MessageFilter.is_matched_by_commit_log` with the record's raw
   properties block (``name\\x01value\\x02…``, see :mod:`basalt.common.message`), only
   when :attr:`MessageFilter.needs_commit_log_check` is true; a ``*``
   subscription never pays for reading properties.

TAG (``"a || b || c"``, RocketMQ's ``FilterAPI.buildSubscriptionData``): the
expression is split on ``||``, each tag stripped, empty ones dropped. ``*`` or
an empty (or blank) expression subscribes to everything. Otherwise the CQ check
passes a tagsCode that is the Java ``String.hashCode`` of a subscribed tag, and
the CommitLog check passes only a TAGS property that *is* a subscribed tag, so
two tags with the same hash (``"Aa"`` and ``"BB"``) never leak into each other.
RocketMQ's broker skips that second check for TAG and leaves it to the client
(``PullAPIWrapper.processPullResult`` filters by ``tagsSet``); Basalt does it in
the store so no consumer has to. As in RocketMQ, an expression that names no
tag (``"||"``) is not ``*``: it matches nothing.

SQL92 (:mod:`basalt.store.sql92`): the CQ check always passes (RocketMQ narrows it
with a bloom filter kept in a ConsumeQueue extension, which Basalt does not
have); the CommitLog check decodes the properties and evaluates the expression.
A SQL92 expression comes from a client, so it is held to
:data:`~basalt.store.sql92.MAX_SQL92_LENGTH` and
:data:`~basalt.store.sql92.MAX_SQL92_TERMS` before it is parsed, and
:func:`build_filter` keeps the filters it built (1,024 of them, by expression
text): the store-node builds a filter for every read, and each distinct
expression is checked and parsed once.

Filters are immutable: build one per subscription and share it between pulls
and threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final, Protocol

from basalt.common.message import PROPERTY_TAGS, decode_properties, property_value
from basalt.store.errors import StoreError
from basalt.store.hashing import tags_code
from basalt.store.sql92 import Sql92Expression, check_sql92_limits, compile_sql92

__all__ = [
    "FILTER_TYPE_SQL92",
    "FILTER_TYPE_TAG",
    "SUB_ALL",
    "MessageFilter",
    "Sql92Filter",
    "TagFilter",
    "UnknownFilterTypeError",
    "build_filter",
]

FILTER_TYPE_TAG: Final = "TAG"
FILTER_TYPE_SQL92: Final = "SQL92"
SUB_ALL: Final = "*"
_TAG_SEPARATOR: Final = "||"
_TAGS_NAME: Final = PROPERTY_TAGS.encode()


class UnknownFilterTypeError(StoreError, ValueError):
    """A subscription names a filter type other than TAG or SQL92."""

    def __init__(self, kind: str) -> None:
        super().__init__(
            f"unknown filter type {kind!r}: expected {FILTER_TYPE_TAG!r} or {FILTER_TYPE_SQL92!r}"
        )
        self.kind = kind


class MessageFilter(Protocol):
    """What the pull loop asks of a subscription: RocketMQ's ``MessageFilter``."""

    @property
    def tags_codes(self) -> tuple[int, ...] | None:
        """:meth:`is_matched_by_consume_queue` as data the C pull loop can test:
        the tagsCodes that pass, or None when every entry passes."""
        ...

    @property
    def needs_commit_log_check(self) -> bool:
        """False when :meth:`is_matched_by_commit_log` is always True: skip reading properties."""
        ...

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        """Whether the entry may match, judged from its ConsumeQueue tagsCode alone.

        False means skip the entry without reading the CommitLog.
        """
        ...

    def is_matched_by_commit_log(self, properties: bytes) -> bool:
        """Whether the record matches, given its raw ``name\\x01value\\x02…`` properties."""
        ...


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A TAG subscription: ``*``, or a set of tags of which a message's TAGS must be one.

    Build with :meth:`parse`. ``tags`` is ignored when ``subscribe_all``.
    """

    subscribe_all: bool
    tags: frozenset[str] = frozenset()
    # Java String.hashCode of each tag: what the ConsumeQueue stores.
    codes: frozenset[int] = field(init=False, repr=False)
    # The tags as UTF-8, compared with the raw TAGS value without decoding it.
    _encoded: frozenset[bytes] = field(init=False, repr=False)
    _codes_tuple: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "codes", frozenset(tags_code(tag) for tag in self.tags))
        object.__setattr__(self, "_codes_tuple", tuple(sorted(self.codes)))
        object.__setattr__(self, "_encoded", frozenset(tag.encode() for tag in self.tags))

    @classmethod
    def parse(cls, expression: str) -> TagFilter:
        """Parse ``"a || b || c"``; ``*``, ``""`` and blank subscribe to everything."""
        stripped = expression.strip()
        if not stripped or stripped == SUB_ALL:
            return cls(subscribe_all=True)
        tags = (tag.strip() for tag in stripped.split(_TAG_SEPARATOR))
        return cls(subscribe_all=False, tags=frozenset(tag for tag in tags if tag))

    @property
    def tags_codes(self) -> tuple[int, ...] | None:
        return None if self.subscribe_all else self._codes_tuple

    @property
    def needs_commit_log_check(self) -> bool:
        return not self.subscribe_all

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        """True for ``*``, else whether ``tags_code`` is the hash of a subscribed tag."""
        return self.subscribe_all or tags_code in self.codes

    def is_matched_by_commit_log(self, properties: bytes) -> bool:
        """True for ``*``, else whether the TAGS property is exactly a subscribed tag."""
        if self.subscribe_all:
            return True
        value = property_value(properties, _TAGS_NAME)
        return value is not None and value in self._encoded


class Sql92Filter:
    """A SQL92 subscription; raises :class:`basalt.store.sql92.Sql92ParseError` when
    invalid, and its subclass :class:`basalt.store.sql92.Sql92LimitError`, before
    parsing, when longer or larger than the SQL92 limits."""

    __slots__ = ("compiled",)

    def __init__(self, expression: str) -> None:
        check_sql92_limits(expression)
        self.compiled: Sql92Expression = compile_sql92(expression)

    @property
    def expression(self) -> str:
        return self.compiled.expression

    @property
    def tags_codes(self) -> tuple[int, ...] | None:
        return None

    @property
    def needs_commit_log_check(self) -> bool:
        return True

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        """Always True: without a bloom filter the tagsCode says nothing about properties."""
        return True

    def is_matched_by_commit_log(self, properties: bytes) -> bool:
        """Whether the expression is TRUE for these properties (UNKNOWN and errors are not)."""
        return self.compiled.matches(decode_properties(properties))

    def __repr__(self) -> str:
        return f"Sql92Filter({self.expression!r})"


def build_filter(kind: str, expression: str) -> MessageFilter:
    """The filter for a subscription of type ``kind`` (``"TAG"`` or ``"SQL92"``).

    ``""`` counts as TAG, as in RocketMQ's ``ExpressionType.isTagType``. Raises
    :class:`UnknownFilterTypeError` for any other type and
    :class:`basalt.store.sql92.Sql92ParseError` for an invalid SQL92 expression
    (:class:`basalt.store.sql92.Sql92LimitError` for one over the limits). SQL92
    filters are cached by expression: the same text gives the same filter.
    """
    if kind in (FILTER_TYPE_TAG, ""):
        return TagFilter.parse(expression)
    if kind == FILTER_TYPE_SQL92:
        return _sql92_filter(expression)
    raise UnknownFilterTypeError(kind)


@lru_cache(maxsize=1024)
def _sql92_filter(expression: str) -> Sql92Filter:
    # Refusals are exceptions, which lru_cache does not keep: a refused
    # expression costs its limit check (and, within the limits, its parse)
    # again, bounded by MAX_SQL92_LENGTH; the keys kept are at most that long.
    return Sql92Filter(expression)

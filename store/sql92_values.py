"""Java values for the SQL92 selector: RocketMQ's conversions and comparisons.

The closures :mod:`basalt.store.sql92` compiles work on Java values, and this module
holds what they call at evaluation time: the conversion of a property (always
a ``String``) to the type of the value it is compared with (``Integer.valueOf``,
``Long.valueOf``, ``Double.valueOf``, ``Boolean.valueOf``), and the comparison
of two values as RocketMQ's ``ComparisonExpression.__compare`` makes it
(:func:`comparator`, chosen once per comparison at compile time from the two
operands' :class:`JavaType`). The rules themselves are stated with the grammar
in :mod:`basalt.store.sql92`; each function here names the Java method it follows.

A conversion that fails raises :class:`Sql92EvaluationError`, which aborts the
whole evaluation as the Java exception does. Everything here is pure and may be
called from any thread.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from basalt.store.errors import StoreError

__all__ = [
    "FROM_STRING",
    "INTEGRAL",
    "INT_MAX",
    "INT_MIN",
    "LONG_DIGITS",
    "LONG_MAX",
    "LONG_MIN",
    "NUMERIC",
    "Compare",
    "Evaluator",
    "JavaType",
    "Sql92EvaluationError",
    "comparator",
    "compare_doubles",
    "compare_strings_as_doubles",
    "java_double",
]


class Sql92EvaluationError(StoreError, ValueError):
    """A property value cannot be converted for a comparison.

    RocketMQ's ``evaluate`` throws here (a NumberFormatException, or a
    ClassCastException for ``TRUE = property``) and the message does not
    match; :meth:`basalt.store.sql92.Sql92Expression.matches` returns False for it.
    """


# A Java value at run time: str (String), int (Integer or Long), float (Double),
# bool (Boolean) or None (null). Which of them a node yields is fixed at compile
# time, so closures never test types.
Evaluator = Callable[[Mapping[str, str]], Any]
Compare = Callable[[Any, Any], int]


# --- Java value conversions (RocketMQ's __compare relies on them) ----------

INT_MAX: Final = (1 << 31) - 1
INT_MIN: Final = -(1 << 31)
LONG_MAX: Final = (1 << 63) - 1
LONG_MIN: Final = -(1 << 63)
# Long.MAX_VALUE has 19 digits: anything longer is out of range, and checking
# the length first keeps int() away from CPython's limit on huge digit strings.
LONG_DIGITS: Final = 19


def _java_integral(text: str, low: int, high: int, kind: str) -> int:
    """``Integer.valueOf``/``Long.valueOf``: optional sign, then decimal digits only."""
    digits = text[1:] if text.startswith(("+", "-")) else text
    # isdecimal() is Unicode category Nd, which is what Java's Character.digit
    # accepts; Java reads UTF-16 units, so a digit outside the BMP is not one.
    # Leading zeros go before int(), which refuses over 4300 digits.
    significant = digits.lstrip("0")
    if (
        digits.isdecimal()
        and (digits.isascii() or max(digits) <= "\uffff")
        and len(significant) <= LONG_DIGITS
    ):
        value = int(significant or "0")
        if text.startswith("-"):
            value = -value
        if low <= value <= high:
            return value
    raise Sql92EvaluationError(f"{text!r} is not a Java {kind}")


def _java_int(text: str) -> int:
    # Fast path: up to 9 ASCII digits is always an int (isdigit alone would
    # also accept superscripts, which int() rejects).
    if len(text) <= 9 and text.isdigit() and text.isascii():
        return int(text)
    return _java_integral(text, INT_MIN, INT_MAX, "int")


def _java_long(text: str) -> int:
    if len(text) <= 18 and text.isdigit() and text.isascii():
        return int(text)
    return _java_integral(text, LONG_MIN, LONG_MAX, "long")


# String.trim() strips every char <= U+0020, control characters included.
_JAVA_TRIM: Final = "".join(map(chr, range(0x21)))
_JAVA_DOUBLE: Final = re.compile(
    r"""[+-]?(?:
        NaN | Infinity
      | (?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?
      | (?P<hex>0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?
    )""",
    re.VERBOSE,
)


def java_double(text: str) -> float:
    """``Double.valueOf``: Java's literal syntax, which Python's float() is not."""
    # Fast path: for ASCII text without '_', a *finite* result of float() is
    # one Java agrees with: the only letters float() then accepts are e/E, and
    # the whitespace it strips is all <= U+0020, which Java's trim() strips.
    # Everything else (inf/nan spellings, suffixes, hex, '_', Unicode digits
    # or spaces) takes the exact check below.
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if value - value == 0.0 and text.isascii() and "_" not in text:
            return value
    trimmed = text.strip(_JAVA_TRIM)
    match = _JAVA_DOUBLE.fullmatch(trimmed)
    if match is None:
        raise Sql92EvaluationError(f"{text!r} is not a Java double")
    # The regex allows at most one f/d suffix, after a digit or a '.', so
    # rstrip removes exactly that suffix and never a hex digit.
    number = trimmed.rstrip("fFdD")
    return float.fromhex(number) if match["hex"] else float(number)


def _java_boolean(text: str) -> bool:
    """``Boolean.valueOf``: true for "true" in any case, false for anything else."""
    return len(text) == 4 and text.lower() == "true"


def _compare_natural(a: Any, b: Any) -> int:
    """compareTo for ints, bools and (where only equality matters) strings."""
    return int(a > b) - int(a < b)


def compare_doubles(a: float, b: float) -> int:
    """``Double.compare``: NaN is above everything and equal to itself; -0.0 < 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a != 0.0:
            return 0
        return (math.copysign(1.0, a) > 0) - (math.copysign(1.0, b) > 0)
    return (a != a) - (b != b)  # at least one NaN


def _compare_as_doubles(a: Any, b: Any) -> int:
    return compare_doubles(float(a), float(b))


def compare_strings_as_doubles(a: str, b: str) -> int:
    # ComparisonExpression.evaluate: "<" between two strings is illegal, so it
    # first tries both as doubles and throws if either is not one.
    return compare_doubles(java_double(a), java_double(b))


def _class_cast(a: Any, b: Any) -> int:
    # __compare casts a Boolean left operand to String to convert it: a bug in
    # RocketMQ that makes TRUE = 'x' throw rather than return false.
    raise Sql92EvaluationError(f"cannot compare boolean {a} with string {b!r}")


def _unequal(a: Any, b: Any) -> int:
    # __compare's fallback for a Boolean against a number: "-1", i.e. unequal.
    return -1


class JavaType(enum.Enum):
    """The Java class of a node's non-null value."""

    STRING = enum.auto()
    INT = enum.auto()  # Integer
    LONG = enum.auto()
    DOUBLE = enum.auto()
    BOOLEAN = enum.auto()
    NULL = enum.auto()  # always null


INTEGRAL: Final = (JavaType.INT, JavaType.LONG)
NUMERIC: Final = (JavaType.INT, JavaType.LONG, JavaType.DOUBLE)
FROM_STRING: Final[dict[JavaType, Callable[[str], Any]]] = {
    JavaType.INT: _java_int,
    JavaType.LONG: _java_long,
    JavaType.DOUBLE: java_double,
    JavaType.BOOLEAN: _java_boolean,
}


def comparator(left: JavaType, right: JavaType) -> Compare:
    """RocketMQ's ``ComparisonExpression.__compare`` for two non-null values of these types.

    Unequal types are converted "up": int to long to double, and a string to
    whatever the other side is.
    """
    if left is right:
        return compare_doubles if left is JavaType.DOUBLE else _compare_natural
    if left in INTEGRAL and right in INTEGRAL:
        return _compare_natural
    if left in NUMERIC and right in NUMERIC:
        return _compare_as_doubles
    if left is JavaType.STRING and right in FROM_STRING:
        convert, compare = FROM_STRING[right], comparator(right, right)
        return lambda a, b: compare(convert(a), b)
    if right is JavaType.STRING and left in NUMERIC:
        convert, compare = FROM_STRING[left], comparator(left, left)
        return lambda a, b: compare(a, convert(b))
    if left is JavaType.BOOLEAN and right is JavaType.STRING:
        return _class_cast
    return _unequal  # a Boolean and a number; NULL-typed values never get here

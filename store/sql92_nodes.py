"""Compiled SQL92 nodes: one builder per operator, checked and specialised at parse time.

The transformer in :mod:`basalt.store.sql92` calls these builders as each grammar rule
reduces, so an expression compiles bottom-up during the parse. A builder runs
RocketMQ's parse-time checks for its operator (the ``check*Operand`` methods of
``SelectorParser``), raising :class:`SemanticError`, which
:func:`basalt.store.sql92.compile_sql92` reports as a ``Sql92ParseError``; it then
returns a :class:`Node` whose ``evaluate`` closure implements the operator's
three-valued logic. Each closure is chosen for its operands' :class:`Kind` and
:class:`~basalt.store.sql92_values.JavaType`, so evaluating tests no types; value
conversions and comparisons come from :mod:`basalt.store.sql92_values`. The semantics
are stated in :mod:`basalt.store.sql92`.

Nodes are frozen and their closures capture only immutable values, so a
compiled expression may be shared by any number of threads.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, NoReturn

from lark import Token

from basalt.store.errors import StoreError
from basalt.store.sql92_values import (
    FROM_STRING,
    INTEGRAL,
    NUMERIC,
    Compare,
    Evaluator,
    JavaType,
    Sql92EvaluationError,
    comparator,
    compare_doubles,
    compare_strings_as_doubles,
    java_double,
)

__all__ = [
    "Kind",
    "Node",
    "SemanticError",
    "as_boolean",
    "between",
    "boolean_literal",
    "decode_string",
    "equal",
    "in_list",
    "is_null",
    "junction",
    "literal",
    "logical_not",
    "negate",
    "property_evaluator",
    "relational",
    "token_end",
    "token_start",
]


class Kind(enum.Enum):
    """Which of RocketMQ's expression classes a node is: the parse-time checks test it."""

    LITERAL = enum.auto()  # ConstantExpression: a string or number literal
    BOOLEAN_LITERAL = enum.auto()  # BooleanConstantExpression: TRUE, FALSE, NULL
    PROPERTY = enum.auto()  # PropertyExpression
    BOOLEAN = enum.auto()  # any other BooleanExpression: comparisons, AND, OR, NOT
    VALUE = enum.auto()  # a negation: neither a constant nor a boolean


_CONSTANT_KINDS: Final = (Kind.LITERAL, Kind.BOOLEAN_LITERAL)
_BOOLEAN_KINDS: Final = (Kind.BOOLEAN, Kind.BOOLEAN_LITERAL)
# Closures nest as deep as the expression; past this, evaluating would risk
# Python's recursion limit (JavaCC's recursive descent has a similar bound).
_MAX_DEPTH: Final = 200


@dataclass(frozen=True, slots=True)
class Node:
    """One compiled subexpression; ``start``/``end`` index its source text."""

    kind: Kind
    type: JavaType
    start: int
    end: int
    evaluate: Evaluator
    depth: int = 1
    # Known at compile time: literals and negated numbers. A NULL literal is
    # not "constant" here, so a constant is never None.
    is_constant: bool = False
    constant: Any = None
    name: str = ""  # the property name when kind is PROPERTY
    # AND and OR chains are flattened: the operands of an n-ary junction.
    junction: str = ""
    operands: tuple[Evaluator, ...] = ()


class SemanticError(StoreError):
    """Raised inside the parse; compile_sql92 turns it into a Sql92ParseError
    (a StoreError like every exception class of the engine; it never leaves
    compile_sql92).

    ``reason`` may contain ``{text}``, replaced by the source of [start, end).
    """

    def __init__(self, start: int, end: int, reason: str) -> None:
        super().__init__(reason)
        self.start = start
        self.end = end
        self.reason = reason


def _reject(node: Node, reason: str) -> NoReturn:
    raise SemanticError(node.start, node.end, reason)


def _constant_evaluator(value: Any) -> Evaluator:
    return lambda _properties: value


def property_evaluator(name: str) -> Evaluator:
    return lambda properties: properties.get(name)


def _check_depth(start: int, end: int, depth: int) -> int:
    if depth > _MAX_DEPTH:
        raise SemanticError(start, end, f"expression nested deeper than {_MAX_DEPTH} levels")
    return depth


def _boolean(start: int, end: int, evaluate: Evaluator, *children: Node) -> Node:
    depth = _check_depth(start, end, 1 + max((child.depth for child in children), default=0))
    return Node(Kind.BOOLEAN, JavaType.BOOLEAN, start, end, evaluate, depth)


def token_start(token: Token) -> int:
    return token.start_pos or 0


def token_end(token: Token) -> int:
    return token.end_pos or 0


def literal(token: Token, type_: JavaType, value: Any) -> Node:
    return Node(
        Kind.LITERAL,
        type_,
        token_start(token),
        token_end(token),
        _constant_evaluator(value),
        is_constant=True,
        constant=value,
    )


def boolean_literal(token: Token, value: bool | None) -> Node:
    return Node(
        Kind.BOOLEAN_LITERAL,
        JavaType.NULL if value is None else JavaType.BOOLEAN,
        token_start(token),
        token_end(token),
        _constant_evaluator(value),
        is_constant=value is not None,
        constant=value,
    )


def decode_string(token: Token) -> str:
    return str(token.value)[1:-1].replace("''", "'")


def as_boolean(node: Node) -> Node:
    """RocketMQ's ``asBooleanExpression``: a property is cast; a number or string is an error."""
    if node.kind in _BOOLEAN_KINDS:
        return node
    if node.kind is Kind.PROPERTY:
        name = node.name

        # A property value is a String, never a Boolean: present means FALSE.
        def cast(properties: Mapping[str, str]) -> bool | None:
            return None if properties.get(name) is None else False

        return replace(node, kind=Kind.BOOLEAN, type=JavaType.BOOLEAN, evaluate=cast)
    _reject(node, "{text} is not a boolean expression")


def logical_not(start: int, operand: Node) -> Node:
    evaluate_operand = operand.evaluate

    def evaluate(properties: Mapping[str, str]) -> bool | None:
        value = evaluate_operand(properties)
        return None if value is None else not value

    return _boolean(start, operand.end, evaluate, operand)


def _junction_evaluator(decisive: bool, operands: Sequence[Evaluator]) -> Evaluator:
    """RocketMQ's left-nested AND (``decisive`` False) or OR (True), flattened.

    The first operand that yields ``decisive`` decides and stops the
    evaluation; otherwise any UNKNOWN makes the result UNKNOWN.
    """
    if len(operands) == 2:
        left, right = operands

        def both(properties: Mapping[str, str]) -> bool | None:
            lv: bool | None = left(properties)
            if lv is decisive:
                return decisive
            rv: bool | None = right(properties)
            if rv is decisive:
                return decisive
            return None if lv is None or rv is None else not decisive

        return both

    def every(properties: Mapping[str, str]) -> bool | None:
        unknown = False
        for operand in operands:
            value: bool | None = operand(properties)
            if value is decisive:
                return decisive
            if value is None:
                unknown = True
        return None if unknown else not decisive

    return every


_DECISIVE: Final = {"AND": False, "OR": True}


def junction(word: str, left: Node, right: Node) -> Node:
    # Flattening is exact: evaluation stays left to right and stops at the
    # first deciding operand, whatever the nesting, and a long chain of ORs
    # does not nest closures thousands deep.
    operands: list[Evaluator] = []
    depth = 0
    for side in (left, right):
        if side.junction == word:
            operands.extend(side.operands)
            depth = max(depth, side.depth - 1)
        else:
            operands.append(side.evaluate)
            depth = max(depth, side.depth)
    return Node(
        Kind.BOOLEAN,
        JavaType.BOOLEAN,
        left.start,
        right.end,
        _junction_evaluator(_DECISIVE[word], operands),
        _check_depth(left.start, right.end, depth + 1),
        junction=word,
        operands=tuple(operands),
    )


def _check_equal_operand(node: Node) -> None:
    if node.kind is Kind.BOOLEAN_LITERAL and node.type is JavaType.NULL:
        _reject(node, "NULL cannot be compared with '=' or '<>': use IS NULL")


def equal(left: Node, right: Node) -> Node:
    """RocketMQ's ``createEqual``: checks, then ``doCreateEqual``."""
    _check_equal_operand(left)
    _check_equal_operand(right)
    if left.kind is Kind.BOOLEAN_LITERAL and right.kind is Kind.LITERAL:
        _reject(right, "{text} cannot be compared with a boolean")
    return _boolean(left.start, right.end, _equal_evaluator(left, right), left, right)


def _equal_evaluator(left: Node, right: Node) -> Evaluator:
    """``doCreateEqual``: null on the left only is UNKNOWN, on the right only FALSE,
    on both TRUE; otherwise ``__compare(l, r) == 0``."""
    compare = comparator(left.type, right.type)
    if left.kind is Kind.PROPERTY and right.is_constant:
        name, constant = left.name, right.constant
        if right.type is JavaType.STRING:

            def property_equals_string(properties: Mapping[str, str]) -> bool | None:
                value = properties.get(name)
                return None if value is None else value == constant

            return property_equals_string

        def property_equals(properties: Mapping[str, str]) -> bool | None:
            value = properties.get(name)
            return None if value is None else compare(value, constant) == 0

        return property_equals
    if left.is_constant and right.kind is Kind.PROPERTY:
        name, constant = right.name, left.constant

        def equals_property(properties: Mapping[str, str]) -> bool:
            value = properties.get(name)
            return False if value is None else compare(constant, value) == 0

        return equals_property
    evaluate_left, evaluate_right = left.evaluate, right.evaluate

    def equals(properties: Mapping[str, str]) -> bool | None:
        lv = evaluate_left(properties)
        rv = evaluate_right(properties)
        if lv is None:
            return True if rv is None else None
        if rv is None:
            return False
        return compare(lv, rv) == 0

    return equals


def is_null(operand: Node, end: int) -> Node:
    """``doCreateEqual(operand, NULL)``: TRUE or FALSE, never UNKNOWN."""
    if operand.kind is Kind.PROPERTY:
        name = operand.name

        def property_is_null(properties: Mapping[str, str]) -> bool:
            return properties.get(name) is None

        return _boolean(operand.start, end, property_is_null, operand)
    evaluate_operand = operand.evaluate

    def is_null(properties: Mapping[str, str]) -> bool:
        return evaluate_operand(properties) is None

    return _boolean(operand.start, end, is_null, operand)


_RELATIONS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_FLIPPED: Final = {">": "<", ">=": "<=", "<": ">", "<=": ">="}


def _check_orderable(node: Node, symbol: str) -> None:
    """RocketMQ's ``checkLessThanOperand``: only numbers, properties and negations."""
    if node.kind in _BOOLEAN_KINDS or (node.kind is Kind.LITERAL and node.type is JavaType.STRING):
        _reject(node, f"{{text}} cannot be compared with '{symbol}': only numbers can")


def relational(symbol: str, left: Node, right: Node) -> Node:
    """``>``, ``>=``, ``<``, ``<=``: UNKNOWN if either side is null."""
    _check_orderable(left, symbol)
    _check_orderable(right, symbol)
    return _boolean(left.start, right.end, _relational_evaluator(symbol, left, right), left, right)


def _relational_evaluator(symbol: str, left: Node, right: Node) -> Evaluator:
    relation = _RELATIONS[symbol]
    if left.type is JavaType.STRING and right.type is JavaType.STRING:
        compare: Compare = compare_strings_as_doubles
    else:
        compare = comparator(left.type, right.type)
    # The common shape, a property against a number, gets its own closure.
    if left.kind is Kind.PROPERTY and right.is_constant:
        return _property_vs_number(relation, left.name, right.type, right.constant)
    if left.is_constant and right.kind is Kind.PROPERTY:
        # k < v is v > k: Java's compareTo is antisymmetric for ints and doubles.
        flipped = _RELATIONS[_FLIPPED[symbol]]
        return _property_vs_number(flipped, right.name, left.type, left.constant)
    evaluate_left, evaluate_right = left.evaluate, right.evaluate

    def relational(properties: Mapping[str, str]) -> bool | None:
        lv = evaluate_left(properties)
        if lv is None:
            return None
        rv = evaluate_right(properties)
        if rv is None:
            return None
        return relation(compare(lv, rv), 0)

    return relational


def _property_vs_number(
    relation: Callable[[Any, Any], bool], name: str, type_: JavaType, constant: Any
) -> Evaluator:
    """``property <op> number``: the property converted to the number's type."""
    if type_ in INTEGRAL:
        convert = FROM_STRING[type_]

        # Python ints order exactly like Java's ints and longs.
        def property_vs_integral(properties: Mapping[str, str]) -> bool | None:
            value = properties.get(name)
            return None if value is None else relation(convert(value), constant)

        return property_vs_integral

    def property_vs_double(properties: Mapping[str, str]) -> bool | None:
        value = properties.get(name)
        if value is None:
            return None
        number = java_double(value)
        # Python's order is Double.compare's except for NaN and two zeros
        # (the constant is never NaN).
        if number == number and (number or constant):
            return relation(number, constant)
        return relation(compare_doubles(number, constant), 0)

    return property_vs_double


def between(value: Node, low: Node, high: Node, negated: bool) -> Node:
    """``BETWEEN`` is ``v >= low AND v <= high``; ``NOT BETWEEN`` is ``v < low OR v > high``."""
    if negated:
        return junction("OR", relational("<", value, low), relational(">", value, high))
    # createBetween checks only two literal bounds: "-1" is a negation, not a
    # ConstantExpression, so "BETWEEN -1 AND -5" passes and never matches.
    if low.kind in _CONSTANT_KINDS and high.kind in _CONSTANT_KINDS:
        for bound in (low, high):
            if bound.type is JavaType.NULL:
                _reject(bound, "BETWEEN bounds cannot be NULL")
        try:
            order = comparator(high.type, low.type)(high.constant, low.constant)
        except Sql92EvaluationError:
            raise SemanticError(
                low.start, high.end, "BETWEEN bounds cannot be compared: {text}"
            ) from None
        if order < 0:
            raise SemanticError(
                low.start, high.end, "BETWEEN lower bound is greater than upper bound: {text}"
            )
    return junction("AND", relational(">=", value, low), relational("<=", value, high))


def in_list(value: Node, strings: Sequence[Token], end: int, negated: bool) -> Node:
    """``IN``: UNKNOWN for a missing property; RocketMQ allows only a property on the left."""
    if value.kind is not Kind.PROPERTY:
        _reject(value, "IN needs a property on its left, not {text}")
    name = value.name
    members = frozenset(decode_string(token) for token in strings)

    def is_in(properties: Mapping[str, str]) -> bool | None:
        candidate = properties.get(name)
        return None if candidate is None else (candidate in members) is not negated

    return _boolean(value.start, end, is_in, value)


def negate(start: int, operand: Node) -> Node:
    """Unary minus: a number negated, anything else NULL (RocketMQ's createNegate)."""
    if operand.is_constant and operand.type in NUMERIC:
        value = -operand.constant
        return Node(
            Kind.VALUE,
            operand.type,
            start,
            operand.end,
            _constant_evaluator(value),
            operand.depth,
            is_constant=True,
            constant=value,
        )
    if operand.kind in (Kind.PROPERTY, Kind.LITERAL, Kind.BOOLEAN_LITERAL):
        evaluate = _constant_evaluator(None)
    else:
        evaluate_operand = operand.evaluate

        # Still evaluated: a conversion error inside must abort as in RocketMQ.
        def evaluate(properties: Mapping[str, str]) -> None:
            evaluate_operand(properties)

    return Node(Kind.VALUE, JavaType.NULL, start, operand.end, evaluate, operand.depth + 1)

"""RocketMQ's SQL92 message selector: parsed once, evaluated as nested closures.

A consumer that subscribes with ``ExpressionType.SQL92`` sends an expression
such as ``TAGS = 'a' AND (price > 10.5 OR region IN ('eu', 'us'))``; the store
evaluates it against every message's properties on the pull path. This module
is a reimplementation of RocketMQ 4.9's ``filter`` module (``SelectorParser.jj``
and ``filter/expression/*``, themselves taken from ActiveMQ): same grammar,
same operator precedence, same value conversions, same three-valued logic. It
was written from reading that source; no code is copied.

Parsing uses lark (a maintained parser library) with a LALR(1) grammar. The
grammar mirrors the JavaCC one rule for rule, and lark calls a transformer as
each rule reduces, so the expression compiles bottom-up during the parse into
nested closures: ``matches`` then runs plain Python calls, with no tree walk and
no dispatch on node types. Every decision about value types is made once, at
compile time, because each operand's runtime type is statically known (a
property is a string or missing, a literal is what it is).

Grammar (loosest binding first; keywords case-insensitive)::

    or_expr    := and_expr (OR and_expr)*
    and_expr   := eq_expr (AND eq_expr)*
    eq_expr    := cmp_expr ( '=' cmp_expr | '<>' cmp_expr | IS NULL | IS NOT NULL )*
    cmp_expr   := unary ( ('>' | '>=' | '<' | '<=') unary
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN '(' string (',' string)* ')' )*
    unary      := '+' unary | '-' unary | NOT unary | primary
    primary    := literal | property | '(' or_expr ')'
    literal    := 'it''s' | 42 | 42L | 4.2 | .5 | 5. | 1E10 | TRUE | FALSE | NULL

Whitespace is `` \\t\\n\\r\\f``; ``-- comment`` (ended by a newline) and
``/* comment */`` are skipped. A property name is letters, digits, ``_``, ``$``
and ``.``, not starting with a digit or ``.``; ``TAGS`` is just a property.

Semantics (RocketMQ's, checked against its source):

* **NOT binds tighter than comparisons** (ActiveMQ's grammar): ``NOT a = 'x'``
  is ``(NOT a) = 'x'``, which never matches (see the boolean rules below).
  Write ``NOT (a = 'x')``. ``=``/``<>``/``IS`` bind looser than ``<``/``>``/
  ``BETWEEN``/``IN``, so ``a > 1 = TRUE`` is ``(a > 1) = TRUE``.
* **Values** are Java objects: property values are ``String``; ``42`` is an
  ``Integer`` (a ``Long`` past 2^31-1, a parse error past 2^63-1); ``4.2`` is a
  ``Double``; ``-x`` negates a number and is NULL for anything else.
* **A string compared with a number** is converted to the number's type:
  ``Integer.valueOf``, ``Long.valueOf`` or ``Double.valueOf``. ``a = 5`` with
  ``a = '5.0'`` therefore fails (not an int); ``a = 5.0`` succeeds. Java's
  rules are kept: ints take an optional sign and decimal digits, nothing else;
  doubles are trimmed of control characters and spaces and accept ``NaN``,
  ``Infinity``, hex and an ``f``/``d`` suffix. Doubles compare like
  ``Double.compareTo`` (NaN above everything, -0.0 below 0.0).
* **A conversion that fails aborts the whole evaluation**, and the message does
  not match: RocketMQ's ``evaluate`` throws, and ``ExpressionMessageFilter``
  logs the throwable and returns false. Because AND/OR evaluate left to right
  and stop early, ``b = 'x' OR a > 5`` matches ``{b: 'x', a: 'abc'}`` but
  ``a > 5 OR b = 'x'`` does not. :meth:`Sql92Expression.evaluate` raises
  :class:`Sql92EvaluationError` there.
* **Two strings** compare only for equality (``=``, ``<>``, ``IN``). ``<`` and
  friends between two properties convert both to doubles (failing as above); a
  string literal as an operand of ``<`` is a parse error.
* **Booleans**: a property equals ``TRUE`` when it is ``'true'`` in any case and
  ``FALSE`` otherwise (``Boolean.valueOf``). A bare property used as a boolean
  (``a AND b``, ``NOT a``) is UNKNOWN when missing and FALSE when present,
  because a property value is a string, never a Java Boolean. ``TRUE = a`` with
  ``a`` present throws in RocketMQ (a ClassCastException), so never matches.
* **NULL**: a comparison with a missing property is UNKNOWN, except where
  RocketMQ's ``=`` is lopsided: ``a = 'x'`` is UNKNOWN for a missing ``a`` but
  ``'x' = a`` is FALSE, and ``a = b`` is TRUE when both are missing. ``IS NULL``
  and ``IS NOT NULL`` are never UNKNOWN. ``NOT UNKNOWN`` is UNKNOWN; AND and OR
  follow SQL: FALSE AND UNKNOWN is FALSE, TRUE OR UNKNOWN is TRUE. A top-level
  UNKNOWN does not match. ``a NOT IN (...)`` is UNKNOWN for a missing ``a``.
* **Parse-time checks** (RocketMQ's ``check*Operand``): ``<``-style operands
  cannot be strings, booleans, NULL or boolean expressions; ``=`` cannot take
  ``NULL`` (use ``IS NULL``) nor ``TRUE = 'x'``; ``IN`` needs a property on its
  left and string literals in its list; ``BETWEEN lo AND hi`` with two literal
  bounds needs ``lo <= hi`` (``NOT BETWEEN`` and negated bounds are not
  checked); the whole expression and the operands of AND/OR/NOT must be
  boolean (a bare property counts).

Deviations, each a strict superset of what RocketMQ accepts:

* a property name may contain ``.`` (RocketMQ's ``ID`` token does not allow it);
* ``0.0`` and decimal literals that underflow to zero are accepted; RocketMQ
  rejects them by comparing with ``Double.MIN_VALUE``, the smallest *positive*
  double, where ``-Double.MAX_VALUE`` was surely meant;
* RocketMQ 5's ``CONTAINS``/``STARTSWITH``/``ENDSWITH`` and ``NOW`` are not
  supported (they are not in 4.9).

Thread safety: compiled expressions are immutable and may be shared by any
number of threads; the parser is built once, lazily, and compiles are cached.
"""

from __future__ import annotations

import enum
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any, Final, NoReturn, cast

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from store.errors import StoreError

__all__ = [
    "Sql92EvaluationError",
    "Sql92Expression",
    "Sql92ParseError",
    "compile_sql92",
]


class Sql92ParseError(StoreError, ValueError):
    """An expression is not valid SQL92 as RocketMQ defines it.

    Raised for syntax errors, unknown characters, unterminated strings, an
    empty expression, and the semantic errors RocketMQ reports while parsing
    (an operand that cannot be compared, a literal out of range, a BETWEEN with
    its bounds reversed). ``position`` is the 0-based index into
    ``expression`` of the offending token (``len(expression)`` for an
    unexpected end); ``reason`` is the message without the position prefix.
    """

    def __init__(self, expression: str, position: int, reason: str) -> None:
        super().__init__(f"SQL92 parse error at position {position}: {reason}")
        self.expression = expression
        self.position = position
        self.reason = reason


class Sql92EvaluationError(StoreError, ValueError):
    """A property value cannot be converted for a comparison.

    RocketMQ's ``evaluate`` throws here (a NumberFormatException, or a
    ClassCastException for ``TRUE = property``) and the message does not
    match; :meth:`Sql92Expression.matches` returns False for it.
    """


# A Java value at run time: str (String), int (Integer or Long), float (Double),
# bool (Boolean) or None (null). Which of them a node yields is fixed at compile
# time, so closures never test types.
Evaluator = Callable[[Mapping[str, str]], Any]
_Compare = Callable[[Any, Any], int]


class Sql92Expression:
    """A compiled SQL92 expression; immutable and safe to share across threads."""

    __slots__ = ("_evaluate", "expression")

    def __init__(self, expression: str, evaluate: Evaluator) -> None:
        self.expression = expression
        self._evaluate = evaluate

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        """RocketMQ's three-valued result: True, False, or None for UNKNOWN.

        Raises :class:`Sql92EvaluationError` when a property value cannot be
        converted for a comparison that the evaluation reaches.
        """
        result: bool | None = self._evaluate(properties)
        return result

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Whether a message with these properties matches: only a TRUE result does.

        UNKNOWN and a failed conversion are both "no match", as in RocketMQ's
        ``ExpressionMessageFilter.isMatchedByCommitLog``.
        """
        try:
            return self._evaluate(properties) is True
        except Sql92EvaluationError:
            return False

    def __repr__(self) -> str:
        return f"Sql92Expression({self.expression!r})"


@lru_cache(maxsize=1024)
def compile_sql92(expression: str) -> Sql92Expression:
    """Parse and compile ``expression``; raises :class:`Sql92ParseError`.

    Results are cached by expression text (RocketMQ's SelectorParser caches
    too): every consumer of a group subscribes with the same string.
    """
    if not expression.strip(_WHITESPACE):
        raise Sql92ParseError(expression, 0, "empty expression")
    try:
        node = cast(_Node, _parser().parse(expression))
    except _SemanticError as e:
        text = expression[e.start : e.end]
        raise Sql92ParseError(expression, e.start, e.reason.format(text=text)) from None
    except UnexpectedInput as e:
        position, reason = _describe_syntax_error(expression, e)
        raise Sql92ParseError(expression, position, reason) from None
    return Sql92Expression(expression, node.evaluate)


# --- grammar ---------------------------------------------------------------

_WHITESPACE: Final = " \t\n\r\f"

# Terminal priorities matter only where Python's first-match alternation could
# differ from JavaCC's longest match: FLOAT must be tried before INT ("1.5" is
# one token, not "1" then ".5"). Keywords are matched as IDENTs and then
# retyped by lark, so "notes" is a property and "NOT" a keyword, and the basic
# (not contextual) lexer keeps a keyword a keyword in every parser state, as
# JavaCC's token manager does.
_GRAMMAR: Final = r"""
start: or_expr

?or_expr: and_expr
        | or_expr OR and_expr                       -> logic_or
?and_expr: eq_expr
         | and_expr AND eq_expr                     -> logic_and
?eq_expr: cmp_expr
        | eq_expr EQ cmp_expr                       -> equal
        | eq_expr NE cmp_expr                       -> not_equal
        | eq_expr IS NULL                           -> is_null
        | eq_expr IS NOT NULL                       -> is_not_null
?cmp_expr: unary
         | cmp_expr (GT | GE | LT | LE) unary       -> relational
         | cmp_expr BETWEEN unary AND unary         -> between
         | cmp_expr NOT BETWEEN unary AND unary     -> not_between
         | cmp_expr IN LPAR STRING ("," STRING)* RPAR       -> in_list
         | cmp_expr NOT IN LPAR STRING ("," STRING)* RPAR   -> not_in_list
?unary: PLUS unary                                  -> plus
      | MINUS unary                                 -> negate
      | NOT unary                                   -> logic_not
      | primary
?primary: STRING                                    -> string_literal
        | INT                                       -> int_literal
        | FLOAT                                     -> float_literal
        | TRUE                                      -> true_literal
        | FALSE                                     -> false_literal
        | NULL                                      -> null_literal
        | IDENT                                     -> property_name
        | LPAR or_expr RPAR                         -> parens

NOT: "NOT"i
AND: "AND"i
OR: "OR"i
BETWEEN: "BETWEEN"i
IN: "IN"i
TRUE: "TRUE"i
FALSE: "FALSE"i
NULL: "NULL"i
IS: "IS"i
EQ: "="
NE: "<>"
GT: ">"
GE: ">="
LT: "<"
LE: "<="
PLUS: "+"
MINUS: "-"
LPAR: "("
RPAR: ")"

IDENT: /[A-Za-z_$][A-Za-z0-9_$.]*/
FLOAT.2: /([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+/
INT: /0|[1-9][0-9]*[lL]?/
STRING: /'(?:''|[^'])*'/

%ignore /[ \t\n\r\f]+/
%ignore /--[^\n\r]*(\r\n|\n|\r)/
%ignore /\/\*[^*]*\*+(?:[^*\/][^*]*\*+)*\//
"""


@cache
def _parser() -> Lark:
    # Built on first use, not at import: the LALR tables take a few tens of ms
    # and most processes that import the store never see a SQL92 subscription.
    return Lark(_GRAMMAR, parser="lalr", lexer="basic", transformer=_Compiler())


def _describe_syntax_error(expression: str, error: UnexpectedInput) -> tuple[int, str]:
    if isinstance(error, UnexpectedCharacters):
        position = error.pos_in_stream or 0
        if expression[position] == "'":
            return position, "unterminated string literal"
        if expression.startswith("/*", position):
            return position, "unterminated comment"
        return position, f"unexpected character {expression[position]!r}"
    if isinstance(error, UnexpectedToken) and error.token.type != "$END":
        token = error.token
        return token.start_pos or 0, f"unexpected {token.value!r}"
    return len(expression), "unexpected end of expression"


# --- Java value conversions (RocketMQ's __compare relies on them) ----------

_INT_MAX: Final = (1 << 31) - 1
_INT_MIN: Final = -(1 << 31)
_LONG_MAX: Final = (1 << 63) - 1
_LONG_MIN: Final = -(1 << 63)
# Long.MAX_VALUE has 19 digits: anything longer is out of range, and checking
# the length first keeps int() away from CPython's limit on huge digit strings.
_LONG_DIGITS: Final = 19


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
        and len(significant) <= _LONG_DIGITS
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
    return _java_integral(text, _INT_MIN, _INT_MAX, "int")


def _java_long(text: str) -> int:
    if len(text) <= 18 and text.isdigit() and text.isascii():
        return int(text)
    return _java_integral(text, _LONG_MIN, _LONG_MAX, "long")


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


def _java_double(text: str) -> float:
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


def _compare_doubles(a: float, b: float) -> int:
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
    return _compare_doubles(float(a), float(b))


def _compare_strings_as_doubles(a: str, b: str) -> int:
    # ComparisonExpression.evaluate: "<" between two strings is illegal, so it
    # first tries both as doubles and throws if either is not one.
    return _compare_doubles(_java_double(a), _java_double(b))


def _class_cast(a: Any, b: Any) -> int:
    # __compare casts a Boolean left operand to String to convert it: a bug in
    # RocketMQ that makes TRUE = 'x' throw rather than return false.
    raise Sql92EvaluationError(f"cannot compare boolean {a} with string {b!r}")


def _unequal(a: Any, b: Any) -> int:
    # __compare's fallback for a Boolean against a number: "-1", i.e. unequal.
    return -1


class _Type(enum.Enum):
    """The Java class of a node's non-null value."""

    STRING = enum.auto()
    INT = enum.auto()  # Integer
    LONG = enum.auto()
    DOUBLE = enum.auto()
    BOOLEAN = enum.auto()
    NULL = enum.auto()  # always null


_INTEGRAL: Final = (_Type.INT, _Type.LONG)
_NUMERIC: Final = (_Type.INT, _Type.LONG, _Type.DOUBLE)
_FROM_STRING: Final[dict[_Type, Callable[[str], Any]]] = {
    _Type.INT: _java_int,
    _Type.LONG: _java_long,
    _Type.DOUBLE: _java_double,
    _Type.BOOLEAN: _java_boolean,
}


def _comparator(left: _Type, right: _Type) -> _Compare:
    """RocketMQ's ``ComparisonExpression.__compare`` for two non-null values of these types.

    Unequal types are converted "up": int to long to double, and a string to
    whatever the other side is.
    """
    if left is right:
        return _compare_doubles if left is _Type.DOUBLE else _compare_natural
    if left in _INTEGRAL and right in _INTEGRAL:
        return _compare_natural
    if left in _NUMERIC and right in _NUMERIC:
        return _compare_as_doubles
    if left is _Type.STRING and right in _FROM_STRING:
        convert, compare = _FROM_STRING[right], _comparator(right, right)
        return lambda a, b: compare(convert(a), b)
    if right is _Type.STRING and left in _NUMERIC:
        convert, compare = _FROM_STRING[left], _comparator(left, left)
        return lambda a, b: compare(a, convert(b))
    if left is _Type.BOOLEAN and right is _Type.STRING:
        return _class_cast
    return _unequal  # a Boolean and a number; NULL-typed values never get here


# --- compiled nodes --------------------------------------------------------


class _Kind(enum.Enum):
    """Which of RocketMQ's expression classes a node is: the parse-time checks test it."""

    LITERAL = enum.auto()  # ConstantExpression: a string or number literal
    BOOLEAN_LITERAL = enum.auto()  # BooleanConstantExpression: TRUE, FALSE, NULL
    PROPERTY = enum.auto()  # PropertyExpression
    BOOLEAN = enum.auto()  # any other BooleanExpression: comparisons, AND, OR, NOT
    VALUE = enum.auto()  # a negation: neither a constant nor a boolean


_CONSTANT_KINDS: Final = (_Kind.LITERAL, _Kind.BOOLEAN_LITERAL)
_BOOLEAN_KINDS: Final = (_Kind.BOOLEAN, _Kind.BOOLEAN_LITERAL)
# Closures nest as deep as the expression; past this, evaluating would risk
# Python's recursion limit (JavaCC's recursive descent has a similar bound).
_MAX_DEPTH: Final = 200


@dataclass(frozen=True, slots=True)
class _Node:
    """One compiled subexpression; ``start``/``end`` index its source text."""

    kind: _Kind
    type: _Type
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


class _SemanticError(Exception):
    """Raised inside the parse; compile_sql92 turns it into a Sql92ParseError.

    ``reason`` may contain ``{text}``, replaced by the source of [start, end).
    """

    def __init__(self, start: int, end: int, reason: str) -> None:
        super().__init__(reason)
        self.start = start
        self.end = end
        self.reason = reason


def _reject(node: _Node, reason: str) -> NoReturn:
    raise _SemanticError(node.start, node.end, reason)


def _constant_evaluator(value: Any) -> Evaluator:
    return lambda _properties: value


def _property_evaluator(name: str) -> Evaluator:
    return lambda properties: properties.get(name)


def _check_depth(start: int, end: int, depth: int) -> int:
    if depth > _MAX_DEPTH:
        raise _SemanticError(start, end, f"expression nested deeper than {_MAX_DEPTH} levels")
    return depth


def _boolean(start: int, end: int, evaluate: Evaluator, *children: _Node) -> _Node:
    depth = _check_depth(start, end, 1 + max((child.depth for child in children), default=0))
    return _Node(_Kind.BOOLEAN, _Type.BOOLEAN, start, end, evaluate, depth)


def _start(token: Token) -> int:
    return token.start_pos or 0


def _end(token: Token) -> int:
    return token.end_pos or 0


def _literal(token: Token, type_: _Type, value: Any) -> _Node:
    return _Node(
        _Kind.LITERAL,
        type_,
        _start(token),
        _end(token),
        _constant_evaluator(value),
        is_constant=True,
        constant=value,
    )


def _boolean_literal(token: Token, value: bool | None) -> _Node:
    return _Node(
        _Kind.BOOLEAN_LITERAL,
        _Type.NULL if value is None else _Type.BOOLEAN,
        _start(token),
        _end(token),
        _constant_evaluator(value),
        is_constant=value is not None,
        constant=value,
    )


def _decode_string(token: Token) -> str:
    return str(token.value)[1:-1].replace("''", "'")


def _as_boolean(node: _Node) -> _Node:
    """RocketMQ's ``asBooleanExpression``: a property is cast; a number or string is an error."""
    if node.kind in _BOOLEAN_KINDS:
        return node
    if node.kind is _Kind.PROPERTY:
        name = node.name

        # A property value is a String, never a Boolean: present means FALSE.
        def cast(properties: Mapping[str, str]) -> bool | None:
            return None if properties.get(name) is None else False

        return replace(node, kind=_Kind.BOOLEAN, type=_Type.BOOLEAN, evaluate=cast)
    _reject(node, "{text} is not a boolean expression")


def _not(start: int, operand: _Node) -> _Node:
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


def _junction(word: str, left: _Node, right: _Node) -> _Node:
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
    return _Node(
        _Kind.BOOLEAN,
        _Type.BOOLEAN,
        left.start,
        right.end,
        _junction_evaluator(_DECISIVE[word], operands),
        _check_depth(left.start, right.end, depth + 1),
        junction=word,
        operands=tuple(operands),
    )


def _check_equal_operand(node: _Node) -> None:
    if node.kind is _Kind.BOOLEAN_LITERAL and node.type is _Type.NULL:
        _reject(node, "NULL cannot be compared with '=' or '<>': use IS NULL")


def _equal(left: _Node, right: _Node) -> _Node:
    """RocketMQ's ``createEqual``: checks, then ``doCreateEqual``."""
    _check_equal_operand(left)
    _check_equal_operand(right)
    if left.kind is _Kind.BOOLEAN_LITERAL and right.kind is _Kind.LITERAL:
        _reject(right, "{text} cannot be compared with a boolean")
    return _boolean(left.start, right.end, _equal_evaluator(left, right), left, right)


def _equal_evaluator(left: _Node, right: _Node) -> Evaluator:
    """``doCreateEqual``: null on the left only is UNKNOWN, on the right only FALSE,
    on both TRUE; otherwise ``__compare(l, r) == 0``."""
    compare = _comparator(left.type, right.type)
    if left.kind is _Kind.PROPERTY and right.is_constant:
        name, constant = left.name, right.constant
        if right.type is _Type.STRING:

            def property_equals_string(properties: Mapping[str, str]) -> bool | None:
                value = properties.get(name)
                return None if value is None else value == constant

            return property_equals_string

        def property_equals(properties: Mapping[str, str]) -> bool | None:
            value = properties.get(name)
            return None if value is None else compare(value, constant) == 0

        return property_equals
    if left.is_constant and right.kind is _Kind.PROPERTY:
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


def _is_null(operand: _Node, end: int) -> _Node:
    """``doCreateEqual(operand, NULL)``: TRUE or FALSE, never UNKNOWN."""
    if operand.kind is _Kind.PROPERTY:
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


def _check_orderable(node: _Node, symbol: str) -> None:
    """RocketMQ's ``checkLessThanOperand``: only numbers, properties and negations."""
    if node.kind in _BOOLEAN_KINDS or (node.kind is _Kind.LITERAL and node.type is _Type.STRING):
        _reject(node, f"{{text}} cannot be compared with '{symbol}': only numbers can")


def _relational(symbol: str, left: _Node, right: _Node) -> _Node:
    """``>``, ``>=``, ``<``, ``<=``: UNKNOWN if either side is null."""
    _check_orderable(left, symbol)
    _check_orderable(right, symbol)
    return _boolean(left.start, right.end, _relational_evaluator(symbol, left, right), left, right)


def _relational_evaluator(symbol: str, left: _Node, right: _Node) -> Evaluator:
    relation = _RELATIONS[symbol]
    if left.type is _Type.STRING and right.type is _Type.STRING:
        compare: _Compare = _compare_strings_as_doubles
    else:
        compare = _comparator(left.type, right.type)
    # The common shape, a property against a number, gets its own closure.
    if left.kind is _Kind.PROPERTY and right.is_constant:
        return _property_vs_number(relation, left.name, right.type, right.constant)
    if left.is_constant and right.kind is _Kind.PROPERTY:
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
    relation: Callable[[Any, Any], bool], name: str, type_: _Type, constant: Any
) -> Evaluator:
    """``property <op> number``: the property converted to the number's type."""
    if type_ in _INTEGRAL:
        convert = _FROM_STRING[type_]

        # Python ints order exactly like Java's ints and longs.
        def property_vs_integral(properties: Mapping[str, str]) -> bool | None:
            value = properties.get(name)
            return None if value is None else relation(convert(value), constant)

        return property_vs_integral

    def property_vs_double(properties: Mapping[str, str]) -> bool | None:
        value = properties.get(name)
        if value is None:
            return None
        number = _java_double(value)
        # Python's order is Double.compare's except for NaN and two zeros
        # (the constant is never NaN).
        if number == number and (number or constant):
            return relation(number, constant)
        return relation(_compare_doubles(number, constant), 0)

    return property_vs_double


def _between(value: _Node, low: _Node, high: _Node, negated: bool) -> _Node:
    """``BETWEEN`` is ``v >= low AND v <= high``; ``NOT BETWEEN`` is ``v < low OR v > high``."""
    if negated:
        return _junction("OR", _relational("<", value, low), _relational(">", value, high))
    # createBetween checks only two literal bounds: "-1" is a negation, not a
    # ConstantExpression, so "BETWEEN -1 AND -5" passes and never matches.
    if low.kind in _CONSTANT_KINDS and high.kind in _CONSTANT_KINDS:
        for bound in (low, high):
            if bound.type is _Type.NULL:
                _reject(bound, "BETWEEN bounds cannot be NULL")
        try:
            order = _comparator(high.type, low.type)(high.constant, low.constant)
        except Sql92EvaluationError:
            raise _SemanticError(
                low.start, high.end, "BETWEEN bounds cannot be compared: {text}"
            ) from None
        if order < 0:
            raise _SemanticError(
                low.start, high.end, "BETWEEN lower bound is greater than upper bound: {text}"
            )
    return _junction("AND", _relational(">=", value, low), _relational("<=", value, high))


def _in_list(value: _Node, strings: Sequence[Token], end: int, negated: bool) -> _Node:
    """``IN``: UNKNOWN for a missing property; RocketMQ allows only a property on the left."""
    if value.kind is not _Kind.PROPERTY:
        _reject(value, "IN needs a property on its left, not {text}")
    name = value.name
    members = frozenset(_decode_string(token) for token in strings)

    def is_in(properties: Mapping[str, str]) -> bool | None:
        candidate = properties.get(name)
        return None if candidate is None else (candidate in members) is not negated

    return _boolean(value.start, end, is_in, value)


def _negate(start: int, operand: _Node) -> _Node:
    """Unary minus: a number negated, anything else NULL (RocketMQ's createNegate)."""
    if operand.is_constant and operand.type in _NUMERIC:
        value = -operand.constant
        return _Node(
            _Kind.VALUE,
            operand.type,
            start,
            operand.end,
            _constant_evaluator(value),
            operand.depth,
            is_constant=True,
            constant=value,
        )
    if operand.kind in (_Kind.PROPERTY, _Kind.LITERAL, _Kind.BOOLEAN_LITERAL):
        evaluate = _constant_evaluator(None)
    else:
        evaluate_operand = operand.evaluate

        # Still evaluated: a conversion error inside must abort as in RocketMQ.
        def evaluate(properties: Mapping[str, str]) -> None:
            evaluate_operand(properties)

    return _Node(_Kind.VALUE, _Type.NULL, start, operand.end, evaluate, operand.depth + 1)


class _Compiler(Transformer[Token, _Node]):
    """Callbacks lark runs as each grammar rule reduces; each returns a :class:`_Node`.

    Stateless, so one instance serves every parse on every thread.
    """

    def start(self, children: list[_Node]) -> _Node:
        return _as_boolean(children[0])

    def string_literal(self, children: list[Token]) -> _Node:
        return _literal(children[0], _Type.STRING, _decode_string(children[0]))

    def int_literal(self, children: list[Token]) -> _Node:
        token = children[0]
        digits = str(token.value).rstrip("lL")
        value = int(digits) if len(digits) <= _LONG_DIGITS else _LONG_MAX + 1
        if value > _LONG_MAX:
            raise _SemanticError(_start(token), _end(token), "{text} is out of range for a long")
        return _literal(token, _Type.INT if value <= _INT_MAX else _Type.LONG, value)

    def float_literal(self, children: list[Token]) -> _Node:
        token = children[0]
        value = float(token.value)
        if math.isinf(value):
            raise _SemanticError(_start(token), _end(token), "{text} is out of range for a double")
        return _literal(token, _Type.DOUBLE, value)

    def true_literal(self, children: list[Token]) -> _Node:
        return _boolean_literal(children[0], True)

    def false_literal(self, children: list[Token]) -> _Node:
        return _boolean_literal(children[0], False)

    def null_literal(self, children: list[Token]) -> _Node:
        return _boolean_literal(children[0], None)

    def property_name(self, children: list[Token]) -> _Node:
        token = children[0]
        name = str(token.value)
        return _Node(
            _Kind.PROPERTY,
            _Type.STRING,
            _start(token),
            _end(token),
            _property_evaluator(name),
            name=name,
        )

    def parens(self, children: list[Any]) -> _Node:
        # RocketMQ returns the inner expression itself: "(a) IN ('x')" is legal.
        left, inner, right = children
        node: _Node = inner
        return replace(node, start=_start(left), end=_end(right))

    def plus(self, children: list[Any]) -> _Node:
        sign, operand = children
        node: _Node = operand
        return replace(node, start=_start(sign))

    def negate(self, children: list[Any]) -> _Node:
        sign, operand = children
        return _negate(_start(sign), operand)

    def logic_not(self, children: list[Any]) -> _Node:
        keyword, operand = children
        return _not(_start(keyword), _as_boolean(operand))

    def logic_and(self, children: list[Any]) -> _Node:
        left, _keyword, right = children
        return _junction("AND", _as_boolean(left), _as_boolean(right))

    def logic_or(self, children: list[Any]) -> _Node:
        left, _keyword, right = children
        return _junction("OR", _as_boolean(left), _as_boolean(right))

    def equal(self, children: list[Any]) -> _Node:
        left, _symbol, right = children
        return _equal(left, right)

    def not_equal(self, children: list[Any]) -> _Node:
        # createNotEqual is NOT(createEqual): UNKNOWN stays UNKNOWN.
        left, _symbol, right = children
        return _not(left.start, _equal(left, right))

    def is_null(self, children: list[Any]) -> _Node:
        operand, _is, null = children
        return _is_null(operand, _end(null))

    def is_not_null(self, children: list[Any]) -> _Node:
        operand, _is, _not_keyword, null = children
        return _not(operand.start, _is_null(operand, _end(null)))

    def relational(self, children: list[Any]) -> _Node:
        left, symbol, right = children
        return _relational(str(symbol.value), left, right)

    def between(self, children: list[Any]) -> _Node:
        value, _between_keyword, low, _and, high = children
        return _between(value, low, high, negated=False)

    def not_between(self, children: list[Any]) -> _Node:
        value, _not_keyword, _between_keyword, low, _and, high = children
        return _between(value, low, high, negated=True)

    def in_list(self, children: list[Any]) -> _Node:
        # value IN ( STRING... )
        return _in_list(children[0], children[3:-1], _end(children[-1]), negated=False)

    def not_in_list(self, children: list[Any]) -> _Node:
        # value NOT IN ( STRING... )
        return _in_list(children[0], children[4:-1], _end(children[-1]), negated=True)

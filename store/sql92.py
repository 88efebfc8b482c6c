"""RocketMQ's SQL92 message selector: parsed once, evaluated as nested closures.

A consumer that subscribes with ``ExpressionType.SQL92`` sends an expression
such as ``TAGS = 'a' AND (price > 10.5 OR region IN ('eu', 'us'))``; the store
evaluates it against every message's properties on the pull path. The selector
is a reimplementation of RocketMQ 4.9's ``filter`` module (``SelectorParser.jj``
and ``filter/expression/*``, themselves taken from ActiveMQ): same grammar,
same operator precedence, same value conversions, same three-valued logic. It
was written from reading that source; no code is copied.

The code is in three modules: this one holds the public API, the grammar and
the transformer that maps each grammar rule to a builder;
:mod:`basalt.store.sql92_nodes` holds the builders (each operator's parse-time checks
and evaluation closure); :mod:`basalt.store.sql92_values` holds Java's value
conversions and comparisons. Import from this module only.

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

Limits: an expression a client sent must first pass :func:`check_sql92_limits`
(at most :data:`MAX_SQL92_LENGTH` characters and :data:`MAX_SQL92_TERMS`
terms), which refuses it with :class:`Sql92LimitError` before lark runs;
:class:`basalt.store.message_filter.Sql92Filter` calls it. ``compile_sql92``
itself compiles any size.

Thread safety: compiled expressions are immutable and may be shared by any
number of threads; the parser is built once, lazily, and compiles are cached.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from functools import cache, lru_cache
from typing import Any, Final, cast

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from basalt.store import sql92_nodes as nodes
from basalt.store.errors import StoreError
from basalt.store.sql92_values import (
    INT_MAX,
    LONG_DIGITS,
    LONG_MAX,
    Evaluator,
    JavaType,
    Sql92EvaluationError,
)

__all__ = [
    "MAX_SQL92_LENGTH",
    "MAX_SQL92_TERMS",
    "Sql92EvaluationError",
    "Sql92Expression",
    "Sql92LimitError",
    "Sql92ParseError",
    "check_sql92_limits",
    "compile_sql92",
]

#: The longest expression compiled, in characters (8 KiB). RocketMQ and
#: ActiveMQ set no limit: their JavaCC parsers take whatever the client sends,
#: and a deep enough expression overflows the broker thread's stack. Brokers
#: that do bound selectors bound them in the hundreds of operators (TIBCO EMS's
#: ``selector_logical_operator_limit``, Eclipse Amlen's 255 nesting levels) and
#: IBM MQ caps a selection string's length (``MQ_SELECTOR_LENGTH``). Real
#: selectors are a few dozen to a few hundred characters; 8 KiB leaves room for
#: an IN list of several hundred tags while refusing, before anything else is
#: done, the 300 KB chains that froze a store-node for seconds (issue 14).
MAX_SQL92_LENGTH: Final = 8192

#: The most terms an expression may have. A term is what the parser builds or
#: tests: a literal, a property name, a keyword (AND, OR, NOT, IS, NULL,
#: BETWEEN, IN, TRUE, FALSE) or an operator symbol; parentheses, commas,
#: whitespace and comments are free. ``(TAGS IS NOT NULL AND TAGS IN ('a', 'b'))
#: AND (a IS NOT NULL AND a BETWEEN 0 AND 3)``, RocketMQ's own example, has 20.
#: 256 keeps a compiled expression small enough that evaluating it over a whole
#: pull's scan stays in the milliseconds (docs/storage.md gives the figure) and
#: its closures far from Python's recursion limit, and still admits an IN list
#: of 250 strings.
MAX_SQL92_TERMS: Final = 256


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


class Sql92LimitError(Sql92ParseError):
    """An expression is longer than :data:`MAX_SQL92_LENGTH` or has more terms
    than :data:`MAX_SQL92_TERMS`: refused before it is parsed.

    A :class:`Sql92ParseError`, so it is answered like one
    (SUBSCRIPTION_PARSE_FAILED). ``limit`` names the limit (``"length"`` or
    ``"terms"``), ``value`` is the expression's length or term count and
    ``maximum`` the limit's value; ``position`` is where the limit is passed
    (the first character or term over it).
    """

    def __init__(
        self, expression: str, position: int, limit: str, value: int, maximum: int
    ) -> None:
        size = f"is {value} characters long" if limit == "length" else f"has {value} terms"
        super().__init__(
            expression, position, f"expression {size}, over the SQL92 {limit} limit of {maximum}"
        )
        self.limit = limit
        self.value = value
        self.maximum = maximum


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

    The compiler itself takes any size; text from a client must pass
    :func:`check_sql92_limits` first (:class:`basalt.store.message_filter.Sql92Filter`
    does), because parsing and evaluating grow with the expression and the
    flattening of long AND/OR chains is quadratic in their length.
    """
    if not expression.strip(_WHITESPACE):
        raise Sql92ParseError(expression, 0, "empty expression")
    try:
        node = cast(nodes.Node, _parser().parse(expression))
    except nodes.SemanticError as e:
        text = expression[e.start : e.end]
        raise Sql92ParseError(expression, e.start, e.reason.format(text=text)) from None
    except UnexpectedInput as e:
        position, reason = _describe_syntax_error(expression, e)
        raise Sql92ParseError(expression, position, reason) from None
    return Sql92Expression(expression, node.evaluate)


def check_sql92_limits(expression: str) -> None:
    """Raise :class:`Sql92LimitError` unless ``expression`` is within
    :data:`MAX_SQL92_LENGTH` and :data:`MAX_SQL92_TERMS`; call it before
    :func:`compile_sql92` on any expression a client sent.

    The length costs nothing; the terms are counted by one regular-expression
    scan of at most :data:`MAX_SQL92_LENGTH` characters, so refusing a hostile
    expression costs a few milliseconds at most whatever its size. The scan is
    lenient: text the grammar refuses is still counted (one term per
    character) and left to lark to report.
    """
    if len(expression) > MAX_SQL92_LENGTH:
        raise Sql92LimitError(
            expression, MAX_SQL92_LENGTH, "length", len(expression), MAX_SQL92_LENGTH
        )
    terms = 0
    first_over = 0
    for match in _TERM.finditer(expression):
        if match.lastgroup != "free":
            terms += 1
            if terms == MAX_SQL92_TERMS + 1:
                first_over = match.start()
    if terms > MAX_SQL92_TERMS:
        raise Sql92LimitError(expression, first_over, "terms", terms, MAX_SQL92_TERMS)


# What the term count counts (see MAX_SQL92_TERMS). Comments come first so
# their text is not counted; a number with an exponent ("1.5E+10") is one term,
# not three; an unterminated string runs to the end as lark would refuse it.
_TERM: Final = re.compile(
    r"""
    (?P<free> --[^\n\r]* | /\*(?:[^*]|\*(?!/))*(?:\*/)? | [\s(),]+ )
    | '(?:''|[^'])*'?
    | (?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[lL]?
    | [A-Za-z_$][A-Za-z0-9_$.]*
    | <> | >= | <= | .
    """,
    re.VERBOSE | re.DOTALL,
)


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


class _Compiler(Transformer[Token, nodes.Node]):
    """Callbacks lark runs as each grammar rule reduces; each returns a compiled node.

    One method per rule alias of :data:`_GRAMMAR`, named after it; the work is
    done by the builders in :mod:`basalt.store.sql92_nodes`. Stateless, so one
    instance serves every parse on every thread.
    """

    def start(self, children: list[nodes.Node]) -> nodes.Node:
        return nodes.as_boolean(children[0])

    def string_literal(self, children: list[Token]) -> nodes.Node:
        return nodes.literal(children[0], JavaType.STRING, nodes.decode_string(children[0]))

    def int_literal(self, children: list[Token]) -> nodes.Node:
        token = children[0]
        digits = str(token.value).rstrip("lL")
        value = int(digits) if len(digits) <= LONG_DIGITS else LONG_MAX + 1
        if value > LONG_MAX:
            raise nodes.SemanticError(
                nodes.token_start(token),
                nodes.token_end(token),
                "{text} is out of range for a long",
            )
        return nodes.literal(token, JavaType.INT if value <= INT_MAX else JavaType.LONG, value)

    def float_literal(self, children: list[Token]) -> nodes.Node:
        token = children[0]
        value = float(token.value)
        if math.isinf(value):
            raise nodes.SemanticError(
                nodes.token_start(token),
                nodes.token_end(token),
                "{text} is out of range for a double",
            )
        return nodes.literal(token, JavaType.DOUBLE, value)

    def true_literal(self, children: list[Token]) -> nodes.Node:
        return nodes.boolean_literal(children[0], True)

    def false_literal(self, children: list[Token]) -> nodes.Node:
        return nodes.boolean_literal(children[0], False)

    def null_literal(self, children: list[Token]) -> nodes.Node:
        return nodes.boolean_literal(children[0], None)

    def property_name(self, children: list[Token]) -> nodes.Node:
        token = children[0]
        name = str(token.value)
        return nodes.Node(
            nodes.Kind.PROPERTY,
            JavaType.STRING,
            nodes.token_start(token),
            nodes.token_end(token),
            nodes.property_evaluator(name),
            name=name,
        )

    def parens(self, children: list[Any]) -> nodes.Node:
        # RocketMQ returns the inner expression itself: "(a) IN ('x')" is legal.
        left, inner, right = children
        node: nodes.Node = inner
        return replace(node, start=nodes.token_start(left), end=nodes.token_end(right))

    def plus(self, children: list[Any]) -> nodes.Node:
        sign, operand = children
        node: nodes.Node = operand
        return replace(node, start=nodes.token_start(sign))

    def negate(self, children: list[Any]) -> nodes.Node:
        sign, operand = children
        return nodes.negate(nodes.token_start(sign), operand)

    def logic_not(self, children: list[Any]) -> nodes.Node:
        keyword, operand = children
        return nodes.logical_not(nodes.token_start(keyword), nodes.as_boolean(operand))

    def logic_and(self, children: list[Any]) -> nodes.Node:
        left, _keyword, right = children
        return nodes.junction("AND", nodes.as_boolean(left), nodes.as_boolean(right))

    def logic_or(self, children: list[Any]) -> nodes.Node:
        left, _keyword, right = children
        return nodes.junction("OR", nodes.as_boolean(left), nodes.as_boolean(right))

    def equal(self, children: list[Any]) -> nodes.Node:
        left, _symbol, right = children
        return nodes.equal(left, right)

    def not_equal(self, children: list[Any]) -> nodes.Node:
        # createNotEqual is NOT(createEqual): UNKNOWN stays UNKNOWN.
        left, _symbol, right = children
        return nodes.logical_not(left.start, nodes.equal(left, right))

    def is_null(self, children: list[Any]) -> nodes.Node:
        operand, _is, null = children
        return nodes.is_null(operand, nodes.token_end(null))

    def is_not_null(self, children: list[Any]) -> nodes.Node:
        operand, _is, _not_keyword, null = children
        return nodes.logical_not(operand.start, nodes.is_null(operand, nodes.token_end(null)))

    def relational(self, children: list[Any]) -> nodes.Node:
        left, symbol, right = children
        return nodes.relational(str(symbol.value), left, right)

    def between(self, children: list[Any]) -> nodes.Node:
        value, _between_keyword, low, _and, high = children
        return nodes.between(value, low, high, negated=False)

    def not_between(self, children: list[Any]) -> nodes.Node:
        value, _not_keyword, _between_keyword, low, _and, high = children
        return nodes.between(value, low, high, negated=True)

    def in_list(self, children: list[Any]) -> nodes.Node:
        # value IN ( STRING... )
        return nodes.in_list(
            children[0], children[3:-1], nodes.token_end(children[-1]), negated=False
        )

    def not_in_list(self, children: list[Any]) -> nodes.Node:
        # value NOT IN ( STRING... )
        return nodes.in_list(
            children[0], children[4:-1], nodes.token_end(children[-1]), negated=True
        )

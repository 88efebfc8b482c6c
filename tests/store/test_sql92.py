"""SQL92 selector: RocketMQ's semantics case by case, then a reference model.

Expected outcomes follow RocketMQ 4.9's filter module (ComparisonExpression,
LogicExpression, UnaryExpression, SelectorParser.jj). ``ERR`` marks a case
where RocketMQ's evaluate() throws, which its broker treats as no match.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basalt.store.errors import StoreError
from basalt.store.sql92 import (
    MAX_SQL92_LENGTH,
    MAX_SQL92_TERMS,
    Sql92EvaluationError,
    Sql92LimitError,
    Sql92ParseError,
    check_sql92_limits,
    compile_sql92,
)

ERR = "error"

Outcome = bool | None | str


def outcome(expression: str, properties: dict[str, str]) -> Outcome:
    """The three-valued result, or ERR; also checks matches() agrees with it."""
    compiled = compile_sql92(expression)
    try:
        result: Outcome = compiled.evaluate(properties)
    except Sql92EvaluationError:
        result = ERR
    assert compiled.matches(properties) is (result is True)
    return result


def check(expression: str, cases: list[tuple[dict[str, str], Outcome]]) -> None:
    got = [outcome(expression, props) for props, _ in cases]
    assert got == [want for _, want in cases], expression


# --- equality -------------------------------------------------------------


def test_string_equality_is_unknown_for_a_missing_property() -> None:
    check("a = 'x'", [({"a": "x"}, True), ({"a": "y"}, False), ({}, None), ({"b": "x"}, None)])
    check("a <> 'x'", [({"a": "y"}, True), ({"a": "x"}, False), ({}, None)])


def test_equality_is_lopsided_about_null_as_in_rocketmq() -> None:
    # doCreateEqual: null only on the left -> null; only on the right -> FALSE;
    # on both -> TRUE.
    check("'x' = a", [({"a": "x"}, True), ({}, False)])
    check("'x' <> a", [({}, True), ({"a": "x"}, False)])
    check("a = b", [({}, True), ({"a": "1"}, False), ({"b": "1"}, None)])


def test_two_properties_compare_as_strings_for_equality() -> None:
    # RocketMQ's ExpressionTest: "3.14" = "3.14", "3.14" <> "3.141".
    check("a = b", [({"a": "3.14", "b": "3.14"}, True), ({"a": "1", "b": "1.0"}, False)])
    check("a <> b", [({"a": "3.14", "b": "3.141"}, True), ({"a": "3.14", "b": "3.14"}, False)])


def test_string_property_against_an_int_uses_integer_value_of() -> None:
    check(
        "a = 5",
        [
            ({"a": "5"}, True),
            ({"a": "+5"}, True),
            ({"a": "005"}, True),  # parseInt takes leading zeros
            ({"a": "-" + "0" * 5000 + "5"}, False),  # ... any number of them
            ({"a": "0" * 5000 + "5"}, True),
            ({"a": "-0"}, False),
            ({"a": "\u0665"}, True),  # ARABIC-INDIC DIGIT FIVE: Character.digit takes it
            ({"a": "6"}, False),
            ({"a": "5.0"}, ERR),  # not an int
            ({"a": " 5"}, ERR),  # parseInt does not trim
            ({"a": "1_0"}, ERR),
            ({"a": "abc"}, ERR),
            ({"a": "3000000000"}, ERR),  # past Integer.MAX_VALUE
            ({"a": "\U0001d7d3"}, ERR),  # a digit outside the BMP is two UTF-16 units
            ({}, None),
        ],
    )
    check("5 = a", [({"a": "5"}, True), ({"a": "x"}, ERR), ({}, False)])


def test_a_literal_past_int_range_is_a_long() -> None:
    check("a = 3000000000", [({"a": "3000000000"}, True), ({"a": "30000000000000000000"}, ERR)])
    check("a > 2147483648", [({"a": "2147483649"}, True), ({"a": "2147483648"}, False)])
    # 2147483647 is still an Integer, so a value past it does not convert.
    check("a > 2147483647", [({"a": "2147483648"}, ERR), ({"a": "2147483647"}, False)])
    check("a = 9223372036854775807L", [({"a": "9223372036854775807"}, True)])
    check("a < -9223372036854775807", [({"a": "-9223372036854775808"}, True)])
    check("a < -9223372036854775807", [({"a": "-9223372036854775809"}, ERR)])


def test_string_property_against_a_double_uses_double_value_of() -> None:
    check(
        "a = 5.0",
        [
            ({"a": "5"}, True),
            ({"a": "5.00"}, True),
            ({"a": " 5 "}, True),  # Double.valueOf trims
            ({"a": "\x005\x1f"}, True),  # ... every char <= U+0020
            ({"a": "5e0"}, True),
            ({"a": "5.0f"}, True),
            ({"a": "5d"}, True),
            ({"a": "0x1.4p2"}, True),  # hex: 1.25 * 4
            ({"a": "5.1"}, False),
            ({"a": "1_0"}, ERR),
            ({"a": "\u00a05"}, ERR),  # NO-BREAK SPACE is not trimmed
            ({"a": "\u0665"}, ERR),  # FloatingDecimal reads ASCII digits only
            ({"a": "five"}, ERR),
            ({}, None),
        ],
    )


def test_java_spellings_of_infinity_and_nan() -> None:
    check("a > 1.5", [({"a": "Infinity"}, True), ({"a": "-Infinity"}, False)])
    check("a > 1.5", [({"a": "inf"}, ERR), ({"a": "infinity"}, ERR), ({"a": "nan"}, ERR)])
    # Double.compareTo puts NaN above everything, and equal to itself.
    check("a > 1.5", [({"a": "NaN"}, True)])
    check("a < 1.5", [({"a": "NaN"}, False)])
    check("a = b", [({"a": "NaN", "b": "NaN"}, True)])
    check("a >= b", [({"a": "NaN", "b": "NaN"}, True), ({"a": "1", "b": "NaN"}, False)])


def test_zero_and_negative_zero_are_ordered_like_double_compare() -> None:
    check("a > -0.0", [({"a": "0"}, True), ({"a": "-0.0"}, False)])
    check("a = 0.0", [({"a": "0"}, True), ({"a": "-0"}, False)])


def test_booleans_use_boolean_value_of() -> None:
    check(
        "a = TRUE",
        [
            ({"a": "true"}, True),
            ({"a": "TRUE"}, True),
            ({"a": "True"}, True),
            ({"a": "yes"}, False),
            ({"a": "1"}, False),
            ({}, None),
        ],
    )
    # Anything but "true" is Boolean.valueOf() false.
    check("a = FALSE", [({"a": "false"}, True), ({"a": "nope"}, True), ({"a": "true"}, False)])
    check("'x' = TRUE", [({}, False)])
    check("5 = TRUE", [({}, False)])  # a Boolean against a number: "-1", unequal
    check("TRUE = TRUE", [({}, True)])
    check("TRUE = FALSE", [({}, False)])


def test_boolean_literal_on_the_left_of_a_property_throws_as_in_rocketmq() -> None:
    # __compare casts the Boolean to String: ClassCastException.
    check("TRUE = a", [({"a": "true"}, ERR), ({}, False)])


def test_comparison_results_compare_as_booleans() -> None:
    check("(a = 'x') = TRUE", [({"a": "x"}, True), ({"a": "y"}, False), ({}, None)])
    check("(a = 'x') = (b = 'y')", [({"a": "x", "b": "y"}, True), ({"a": "x", "b": "z"}, False)])
    check("(a = 'x') = 5", [({"a": "x"}, False)])
    check("(a = 'x') = b", [({"a": "x", "b": "true"}, ERR)])


# --- ordering ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "value", "expected"),
    [
        ("a > 10", "11", True),
        ("a > 10", "10", False),
        ("a >= 10", "10", True),
        ("a >= 10", "9", False),
        ("a < 10", "9", True),
        ("a < 10", "10", False),
        ("a <= 10", "10", True),
        ("a <= 10", "11", False),
        ("a > -5", "-4", True),
        ("a > -5", "-6", False),
        ("a < 2.5", "2.4999", True),
        ("a >= 2.5", "2.5", True),
        ("a > 10", "10.5", ERR),  # Integer.valueOf
        ("a > 10.0", "10.5", True),
        ("a > 3.1E10", "3.1415E10", True),  # RocketMQ's testEvaluate_exponent
        ("10 < a", "11", True),
        ("10 < a", "9", False),
        ("10.5 >= a", "10.5", True),
        ("-1.5 > a", "-2", True),
    ],
)
def test_relational_operators(expression: str, value: str, expected: Outcome) -> None:
    assert outcome(expression, {"a": value}) == expected
    assert outcome(expression, {}) is None


def test_two_properties_order_as_doubles_never_as_strings() -> None:
    # "<" between two strings is illegal; RocketMQ tries both as doubles.
    check("a > b", [({"a": "20", "b": "10"}, True), ({"a": "10", "b": "20"}, False)])
    check("a < b", [({"a": "2.5", "b": "10"}, True)])  # "2.5" > "10" as strings
    check("a < b", [({"a": "x", "b": "1"}, ERR), ({"a": "1", "b": "x"}, ERR)])
    check("a < b", [({"a": "1"}, None), ({"b": "1"}, None)])


def test_negation_of_a_property_is_null() -> None:
    check("-a > 1", [({"a": "5"}, None), ({}, None)])
    check("-a IS NULL", [({"a": "5"}, True)])


def test_unary_signs_on_literals() -> None:
    check("a = - -5", [({"a": "5"}, True)])
    check("a = --5", [({"a": "5"}, True)])  # "--" starts a comment only when a newline ends it
    check("a = +5", [({"a": "5"}, True)])
    check("a = -2.5", [({"a": "-2.5"}, True)])


# --- BETWEEN, IN, IS NULL -----------------------------------------------------


def test_between() -> None:
    check(
        "a BETWEEN 2 AND 10",
        [
            ({"a": "2"}, True),
            ({"a": "10"}, True),
            ({"a": "6"}, True),
            ({"a": "1"}, False),
            ({"a": "11"}, False),
            ({"a": "x"}, ERR),
            ({}, None),
        ],
    )
    # v >= 2 uses Integer.valueOf, so a decimal value throws before v <= 10.5.
    check("a BETWEEN 2 AND 10.5", [({"a": "10"}, True), ({"a": "10.2"}, ERR)])
    check("a BETWEEN b AND c", [({"a": "5", "b": "1", "c": "9"}, True)])
    check("a BETWEEN b AND c", [({"a": "5", "b": "1"}, None)])
    # v >= lo is FALSE, so v <= hi (UNKNOWN) does not matter.
    check("a BETWEEN b AND c", [({"a": "0", "b": "1"}, False)])


def test_not_between() -> None:
    check(
        "a NOT BETWEEN 2 AND 10",
        [({"a": "1"}, True), ({"a": "11"}, True), ({"a": "5"}, False), ({}, None)],
    )


def test_between_checks_only_two_literal_bounds() -> None:
    with pytest.raises(Sql92ParseError):
        compile_sql92("a BETWEEN 10 AND 0")
    # "-1" is a negation, not a literal: RocketMQ does not check it.
    check("a BETWEEN -1 AND -5", [({"a": "-3"}, False)])
    # NOT BETWEEN is never checked.
    check("a NOT BETWEEN 10 AND 2", [({"a": "5"}, True)])
    check("a BETWEEN 2 AND 2", [({"a": "2"}, True)])
    check("a BETWEEN 2 AND 2.5", [({"a": "2"}, True)])


def test_in_and_not_in() -> None:
    check("a IN ('x', 'y')", [({"a": "x"}, True), ({"a": "y"}, True), ({"a": "z"}, False)])
    check("a IN ('x', 'y')", [({}, None)])
    check("a NOT IN ('x', 'y')", [({"a": "z"}, True), ({"a": "x"}, False), ({}, None)])
    check("a IN ('1')", [({"a": "1"}, True), ({"a": "1.0"}, False)])  # string equality only
    check("a IN ('it''s')", [({"a": "it's"}, True)])
    check("(a) IN ('x')", [({"a": "x"}, True)])
    many = ", ".join(f"'{i}'" for i in range(20))
    check(f"a IN ({many})", [({"a": "19"}, True), ({"a": "20"}, False)])


def test_is_null_is_never_unknown() -> None:
    check("a IS NULL", [({}, True), ({"a": ""}, False), ({"a": "x"}, False)])
    check("a IS NOT NULL", [({}, False), ({"a": ""}, True)])
    check("NULL IS NULL", [({}, True)])
    check("'x' IS NULL", [({}, False)])
    check("'x' IS NOT NULL", [({}, True)])
    check("(a = 'x') IS NULL", [({}, True), ({"a": "y"}, False)])


# --- logic ------------------------------------------------------------------


AB = "a = 'x' {} b = 'y'"
PAIRS = {
    ("T", "T"): {"a": "x", "b": "y"},
    ("T", "F"): {"a": "x", "b": "q"},
    ("T", "U"): {"a": "x"},
    ("F", "T"): {"a": "q", "b": "y"},
    ("F", "F"): {"a": "q", "b": "q"},
    ("F", "U"): {"a": "q"},
    ("U", "T"): {"b": "y"},
    ("U", "F"): {"b": "q"},
    ("U", "U"): {},
}
TRUTH = {"T": True, "F": False, "U": None}


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_three_valued_and_or(pair: tuple[str, str]) -> None:
    left, right = TRUTH[pair[0]], TRUTH[pair[1]]
    props = PAIRS[pair]
    want_and = False if False in (left, right) else None if None in (left, right) else True
    want_or = True if True in (left, right) else None if None in (left, right) else False
    assert outcome(AB.format("AND"), props) is want_and
    assert outcome(AB.format("OR"), props) is want_or


def test_not_of_unknown_is_unknown() -> None:
    check("NOT (a = 'x')", [({"a": "y"}, True), ({"a": "x"}, False), ({}, None)])
    check("NOT NULL", [({}, None)])
    check("NOT NOT (a = 'x')", [({"a": "x"}, True), ({}, None)])


def test_constant_expressions() -> None:
    check("TRUE", [({}, True), ({"a": "b"}, True)])
    check("FALSE", [({}, False)])
    check("NULL", [({}, None)])  # UNKNOWN at the top: no match


def test_a_bare_property_is_false_when_present_and_unknown_when_missing() -> None:
    # asBooleanExpression casts it; a String is never a Java Boolean.
    check("a", [({"a": "true"}, False), ({}, None)])
    check("NOT a", [({"a": "x"}, True), ({}, None)])
    check("a OR TRUE", [({}, True)])


def test_a_failed_conversion_aborts_evaluation_left_to_right() -> None:
    props = {"a": "abc", "b": "x"}
    check("b = 'x' OR a > 5", [(props, True)])  # OR stops at TRUE
    check("a > 5 OR b = 'x'", [(props, ERR)])
    check("b = 'q' AND a > 5", [(props, False)])  # AND stops at FALSE
    check("a > 5 AND b = 'q'", [(props, ERR)])
    check("b = 'x' OR b = 'y' OR a > 5", [(props, True)])
    check("b = 'y' OR b = 'z' OR a > 5", [(props, ERR)])


def test_precedence_not_over_and_over_or() -> None:
    check("FALSE AND FALSE OR TRUE", [({}, True)])  # (F AND F) OR T
    check("TRUE OR FALSE AND FALSE", [({}, True)])  # T OR (F AND F)
    check("NOT TRUE OR TRUE", [({}, True)])  # (NOT T) OR T
    check("NOT TRUE AND FALSE", [({}, False)])
    check("NOT (TRUE AND FALSE)", [({}, True)])
    # a OR (b AND c): with a TRUE it is TRUE; (a OR b) AND c would be UNKNOWN.
    check("a = '1' OR b = '1' AND c = '1'", [({"a": "1", "b": "0"}, True)])


def test_not_binds_tighter_than_comparison_as_in_rocketmq() -> None:
    # NOT a = 'x' is (NOT a) = 'x': a Boolean against a String, which throws.
    check("NOT a = 'x'", [({"a": "x"}, ERR), ({"a": "y"}, ERR), ({}, None)])
    check("NOT (a = 'x')", [({"a": "y"}, True)])


def test_equality_binds_looser_than_ordering() -> None:
    check("a > 1 = TRUE", [({"a": "2"}, True), ({"a": "0"}, False)])
    check("a = b > 1", [({"a": "true", "b": "2"}, True)])  # a = (b > 1)


def test_long_chains_compile_flat() -> None:
    chain = " OR ".join(f"a = '{i}'" for i in range(2000))
    check(chain, [({"a": "1999"}, True), ({"a": "x"}, False), ({}, None)])
    chain = " AND ".join("a IS NOT NULL" for _ in range(2000))
    check(chain, [({"a": "1"}, True), ({}, False)])
    # A flattened chain counts as one level, so it nests like any operand.
    check(f"NOT ({chain}) OR b = 'x'", [({"a": "1"}, None), ({"b": "x"}, True)])


# --- lexical forms ----------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "a between 2 and 10",
        "a BeTwEeN 2 AnD 10",
        "a is not null and a in ('5') or false",
        "A_ IS NULL Or a Not Between 20 And 30",
        "a > 4 AND NOT (a > 10) and TRUE",
        "true AND a nOt In ('x')",
    ],
)
def test_keywords_are_case_insensitive(expression: str) -> None:
    assert compile_sql92(expression).matches({"a": "5"})


def test_property_names_are_case_sensitive_and_may_start_like_keywords() -> None:
    check("A = 'x'", [({"a": "x"}, None), ({"A": "x"}, True)])
    for name in ("notes", "order", "android", "island", "nullable", "TRUEish", "inx", "isa"):
        check(f"{name} = 'x'", [({name: "x"}, True)])
    for name in ("$a", "_a", "a1", "a.b.c", "TAGS", "a$b_c.d1"):
        check(f"{name} = 'x'", [({name: "x"}, True)])


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("5", "5"),
        ("5L", "5"),
        ("5l", "5"),
        ("0", "0"),
        ("1.", "1"),
        (".5", "0.5"),
        ("1e1", "10"),
        ("1E+1", "10"),
        ("15e-1", "1.5"),
        ("1.5E1", "15"),
        ("0.25", "0.25"),
        ("'5'", "5"),
        ("''", ""),
        ("'it''s'", "it's"),
        ("''''", "'"),
        ("'a\nb'", "a\nb"),
        ("'héllo ✓'", "héllo ✓"),
    ],
)
def test_literal_forms(literal: str, value: str) -> None:
    assert outcome(f"a = {literal}", {"a": value}) is True


def test_comments_and_whitespace() -> None:
    check("a = 'x' /* b = 'y' */ AND\tc IS NULL", [({"a": "x"}, True)])
    check("a = 'x' -- trailing remark\n", [({"a": "x"}, True)])
    check("\n\r\f a = 'x' \n", [({"a": "x"}, True)])
    check("/**/a/***/=/* ** */'x'", [({"a": "x"}, True)])


# --- parse errors -----------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "position", "reason"),
    [
        ("", 0, "empty expression"),
        ("  \n ", 0, "empty expression"),
        ("TAGS = AND", 7, "unexpected 'AND'"),
        ("a = ", 4, "unexpected end of expression"),
        ("(a = 1", 6, "unexpected end of expression"),
        ("a = 1)", 5, "unexpected ')'"),
        ("a = 'x' AND AND b", 12, "unexpected 'AND'"),
        ("a = 'x' b = 'y'", 8, "unexpected 'b'"),
        ("a = 'x", 4, "unterminated string literal"),
        ("a = 'x' /* open", 8, "unterminated comment"),
        ("a = 1 # 2", 6, "unexpected character '#'"),
        ("é = 1", 0, "unexpected character 'é'"),
        ("a = 007", 5, "unexpected '0'"),
        ("a = 0L", 5, "unexpected 'L'"),
        ("a = 1 -- no newline", 6, "unexpected '-'"),
        ("a == 1", 3, "unexpected '='"),
        ("a IN (1)", 6, "unexpected '1'"),
        ("a IN ()", 6, "unexpected ')'"),
        ("a > 'x'", 4, "'x' cannot be compared with '>': only numbers can"),
        ("'x' <= a", 0, "'x' cannot be compared with '<=': only numbers can"),
        ("a > TRUE", 4, "TRUE cannot be compared with '>': only numbers can"),
        ("a < (b = 1)", 4, "(b = 1) cannot be compared with '<': only numbers can"),
        ("NOT a > 1", 0, "NOT a cannot be compared with '>': only numbers can"),
        ("a > NULL", 4, "NULL cannot be compared with '>': only numbers can"),
        ("a = NULL", 4, "NULL cannot be compared with '=' or '<>': use IS NULL"),
        ("NULL <> a", 0, "NULL cannot be compared with '=' or '<>': use IS NULL"),
        ("TRUE = 'x'", 7, "'x' cannot be compared with a boolean"),
        ("1 IN ('x')", 0, "IN needs a property on its left, not 1"),
        ("(a = 1) NOT IN ('x')", 0, "IN needs a property on its left, not (a = 1)"),
        ("5", 0, "5 is not a boolean expression"),
        ("'x'", 0, "'x' is not a boolean expression"),
        ("-a", 0, "-a is not a boolean expression"),
        ("a = 1 AND 5", 10, "5 is not a boolean expression"),
        ("NOT 1.5 OR a", 4, "1.5 is not a boolean expression"),
        ("a BETWEEN 5 AND 3", 10, "BETWEEN lower bound is greater than upper bound: 5 AND 3"),
        ("a BETWEEN 5.5 AND 5", 10, "BETWEEN lower bound is greater than upper bound: 5.5 AND 5"),
        ("a BETWEEN 'x' AND 3", 10, "BETWEEN bounds cannot be compared: 'x' AND 3"),
        ("a BETWEEN 1 AND '3'", 16, "'3' cannot be compared with '<=': only numbers can"),
        ("a BETWEEN NULL AND 3", 10, "BETWEEN bounds cannot be NULL"),
        ("a = 9223372036854775808", 4, "9223372036854775808 is out of range for a long"),
        ("a > 1e400", 4, "1e400 is out of range for a double"),
    ],
)
def test_parse_errors(expression: str, position: int, reason: str) -> None:
    with pytest.raises(Sql92ParseError) as caught:
        compile_sql92(expression)
    error = caught.value
    assert (error.position, error.reason) == (position, reason)
    assert error.expression == expression
    assert str(error) == f"SQL92 parse error at position {position}: {reason}"


def test_parse_error_is_a_value_error_and_a_store_error() -> None:
    with pytest.raises(ValueError, match="position 7: unexpected 'AND'"):
        compile_sql92("TAGS = AND")
    with pytest.raises(StoreError):
        compile_sql92("TAGS = AND")


def test_nesting_is_bounded() -> None:
    with pytest.raises(Sql92ParseError, match="nested deeper than"):
        compile_sql92("NOT " * 300 + "TRUE")
    # Parentheses alone add no depth.
    check("(" * 300 + "a = 'x'" + ")" * 300, [({"a": "x"}, True)])


def test_compiles_are_cached_and_keep_their_text() -> None:
    text = "a = 'cached' AND b > 1"
    first = compile_sql92(text)
    assert compile_sql92(text) is first
    assert first.expression == text
    assert repr(first) == f"Sql92Expression({text!r})"


# --- limits (issue 14) ----------------------------------------------------------


def checked(expression: str) -> bool | None:
    """What a subscription gets: the limits, then the compile, then one evaluation."""
    check_sql92_limits(expression)
    return compile_sql92(expression).evaluate({"a": "x"})


def in_list(strings: int) -> str:
    # "a", "IN" and one term per string.
    return "a IN (" + ", ".join(["'x'"] * strings) + ")"


def test_an_expression_at_the_length_limit_parses_and_one_past_is_refused() -> None:
    at_limit = "a = '" + "x" * (MAX_SQL92_LENGTH - 6) + "'"
    assert len(at_limit) == MAX_SQL92_LENGTH
    assert checked(at_limit) is False
    with pytest.raises(Sql92LimitError) as caught:
        checked(at_limit + " ")
    error = caught.value
    assert (error.limit, error.value, error.maximum) == ("length", 8193, 8192)
    assert error.position == MAX_SQL92_LENGTH
    assert str(error) == (
        "SQL92 parse error at position 8192: "
        "expression is 8193 characters long, over the SQL92 length limit of 8192"
    )


def test_an_expression_at_the_term_limit_parses_and_one_past_is_refused() -> None:
    at_limit = in_list(MAX_SQL92_TERMS - 2)
    assert checked(at_limit) is True
    over = in_list(MAX_SQL92_TERMS - 1)
    with pytest.raises(Sql92LimitError) as caught:
        checked(over)
    error = caught.value
    assert (error.limit, error.value, error.maximum) == ("terms", 257, 256)
    assert over[error.position :] == "'x')"  # the 257th term
    assert "has 257 terms, over the SQL92 terms limit of 256" in str(error)


@pytest.mark.parametrize(
    ("expression", "terms"),
    [
        # RocketMQ's documentation example.
        ("(TAGS IS NOT NULL AND TAGS IN ('a', 'b')) AND (a IS NOT NULL AND a BETWEEN 0 AND 3)", 20),
        ("a > 1.5E+10 OR b < .5 OR c = 42L", 11),  # a number is one term, signs included
        ("a = 'it''s AND b' -- AND AND\n AND /* OR OR */ b <> 'x'", 7),  # strings, comments
        ("((((a))))", 1),  # parentheses are free
        ("a >= 1 AND a <= 2 AND a <> 3", 11),  # two-character symbols are one term
    ],
)
def test_what_counts_as_a_term(expression: str, terms: int) -> None:
    # The count does not parse, so padding with bare words measures it exactly.
    at_limit = expression + " a" * (MAX_SQL92_TERMS - terms)
    check_sql92_limits(at_limit)
    with pytest.raises(Sql92LimitError, match=f"has {MAX_SQL92_TERMS + 1} terms"):
        check_sql92_limits(at_limit + " a")


def test_hostile_chains_are_refused_before_parsing() -> None:
    # Issue 14's 30,000-term AND chain (300 KB): refused on its length alone.
    chain = " AND ".join(f"a = '{i}'" for i in range(30_000))
    with pytest.raises(Sql92LimitError) as caught:
        check_sql92_limits(chain)
    assert caught.value.limit == "length"
    assert caught.value.value == len(chain)
    # Within the length, too many terms.
    short_chain = " AND ".join(["a"] * 1300)
    with pytest.raises(Sql92LimitError) as caught:
        check_sql92_limits(short_chain)
    assert (caught.value.limit, caught.value.value) == ("terms", 2599)


def test_a_limit_error_is_a_parse_error_and_a_store_error() -> None:
    # So the services answer it like any other unparsable subscription.
    assert issubclass(Sql92LimitError, Sql92ParseError)
    assert issubclass(Sql92LimitError, StoreError)


def test_evaluation_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'abc' is not a Java int"):
        compile_sql92("a = 5").evaluate({"a": "abc"})


# --- reference model ----------------------------------------------------------
#
# Random expression trees, rendered to text with every operand parenthesised,
# evaluated directly by a small model of RocketMQ written from its source
# (not from store/sql92.py), and compared with the compiled expression.


class RefError(Exception):
    """RocketMQ's evaluate() would throw."""


INT_MAX = 2**31 - 1

# How Java converts each property value the model uses, written out by hand:
# (Integer.valueOf, Long.valueOf, Double.valueOf); None where Java throws.
JAVA_VALUES: dict[str, tuple[int | None, int | None, float | None]] = {
    "5": (5, 5, 5.0),
    "10": (10, 10, 10.0),
    "-3": (-3, -3, -3.0),
    "+7": (7, 7, 7.0),
    "0": (0, 0, 0.0),
    "2.5": (None, None, 2.5),
    "-0.5": (None, None, -0.5),
    "1e3": (None, None, 1000.0),
    " 42": (None, None, 42.0),
    "1.5f": (None, None, 1.5),
    "3000000000": (None, 3000000000, 3e9),
    "NaN": (None, None, math.nan),
    "Infinity": (None, None, math.inf),
    "inf": (None, None, None),
    "abc": (None, None, None),
    "true": (None, None, None),
    "TRUE": (None, None, None),
    "false": (None, None, None),
    "": (None, None, None),
    "it's": (None, None, None),
}
WORDS = sorted(JAVA_VALUES)
NAMES = ["a", "b", "c"]
INT_POOL = [0, 1, 5, 10, 42, 2147483647, 2147483648, 3000000000]
DECIMAL_POOL = [0.5, 2.5, 10.0, 42.0, 1000.0, 3e9]


@dataclass(frozen=True)
class Prop:
    name: str


@dataclass(frozen=True)
class IntLit:
    value: int  # negative values render as a negation


@dataclass(frozen=True)
class DecLit:
    value: float


@dataclass(frozen=True)
class StrLit:
    value: str


@dataclass(frozen=True)
class BoolLit:
    value: bool


Operand = Prop | IntLit | DecLit | StrLit | BoolLit
LITERALS = (IntLit, DecLit, StrLit)


@dataclass(frozen=True)
class Cmp:
    op: str
    left: Operand
    right: Operand


@dataclass(frozen=True)
class Between:
    negated: bool
    value: Prop
    low: Operand
    high: Operand


@dataclass(frozen=True)
class In:
    negated: bool
    value: Prop
    members: tuple[str, ...]


@dataclass(frozen=True)
class IsNull:
    negated: bool
    value: Prop


@dataclass(frozen=True)
class Const:
    value: bool


@dataclass(frozen=True)
class Bare:
    value: Prop  # a property used as a boolean


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class And:
    left: Node
    right: Node


@dataclass(frozen=True)
class Or:
    left: Node
    right: Node


Node = Cmp | Between | In | IsNull | Const | Bare | Not | And | Or


def render_operand(operand: Operand) -> str:
    match operand:
        case Prop(name):
            return name
        case IntLit(value):
            return f"-{-value}" if value < 0 else str(value)
        case DecLit(value):
            return f"-{-value!r}" if value < 0 else repr(value)
        case StrLit(value):
            return "'" + value.replace("'", "''") + "'"
        case BoolLit(value):
            return "TRUE" if value else "false"
    raise AssertionError(operand)


def render(node: Node, upper: bool) -> str:
    def kw(word: str) -> str:
        return word if upper else word.lower()

    match node:
        case Cmp(op, left, right):
            return f"{render_operand(left)} {op} {render_operand(right)}"
        case Between(negated, value, low, high):
            not_ = kw("NOT ") if negated else ""
            return (
                f"{value.name} {not_}{kw('BETWEEN')} {render_operand(low)} "
                f"{kw('AND')} {render_operand(high)}"
            )
        case In(negated, value, members):
            listed = ", ".join(render_operand(StrLit(m)) for m in members)
            return f"{value.name} {kw('NOT ') if negated else ''}{kw('IN')} ({listed})"
        case IsNull(negated, value):
            return f"{value.name} {kw('IS')} {kw('NOT ') if negated else ''}{kw('NULL')}"
        case Const(value):
            return kw("TRUE") if value else kw("FALSE")
        case Bare(value):
            return value.name
        case Not(operand):
            return f"{kw('NOT')} ({render(operand, upper)})"
        case And(left, right):
            return f"({render(left, upper)}) {kw('AND')} ({render(right, upper)})"
        case Or(left, right):
            return f"({render(left, upper)}) {kw('OR')} ({render(right, upper)})"
    raise AssertionError(node)


# A Java value: (class, value) with class one of str/int/long/double/bool.
JValue = tuple[str, Any] | None


def java_value(operand: Operand, props: dict[str, str]) -> JValue:
    match operand:
        case Prop(name):
            return None if name not in props else ("str", props[name])
        case IntLit(value):
            return ("int" if abs(value) <= INT_MAX else "long", value)
        case DecLit(value):
            return ("double", value)
        case StrLit(value):
            return ("str", value)
        case BoolLit(value):
            return ("bool", value)
    raise AssertionError(operand)


def convert_string(text: str, to: str) -> Any:
    if to == "bool":
        return text.lower() == "true"
    converted = JAVA_VALUES[text][{"int": 0, "long": 1, "double": 2}[to]]
    if converted is None:
        raise RefError
    return converted


def sign(x: float) -> int:
    return (x > 0) - (x < 0)


def double_compare(a: float, b: float) -> int:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) - math.isnan(b)
    return sign(a - b)


def java_compare(left: tuple[str, Any], right: tuple[str, Any]) -> int:
    """ComparisonExpression.__compare, with CONVERT_STRING_EXPRESSIONS on."""
    (lc, lv), (rc, rv) = left, right
    numbers = ("int", "long", "double")
    if lc == rc:
        if lc == "double":
            return double_compare(lv, rv)
        return sign((lv > rv) - (lv < rv))
    if lc in numbers and rc in numbers:
        if "double" in (lc, rc):
            return double_compare(float(lv), float(rv))
        return sign(lv - rv)
    if lc == "str" and rc in (*numbers, "bool"):
        return java_compare((rc, convert_string(lv, rc)), right)
    if rc == "str" and lc in numbers:
        return java_compare(left, (lc, convert_string(rv, lc)))
    if lc == "bool" and rc == "str":
        raise RefError  # ClassCastException
    return -1


def ref_equal(left: JValue, right: JValue) -> bool | None:
    if left is None:
        return True if right is None else None
    if right is None:
        return False
    return java_compare(left, right) == 0


def ref_order(op: str, left: JValue, right: JValue) -> bool | None:
    if left is None or right is None:
        return None
    if left[0] == "str" and right[0] == "str":
        c = double_compare(convert_string(left[1], "double"), convert_string(right[1], "double"))
    else:
        c = java_compare(left, right)
    return {"<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[op]


def ref_and(left: bool | None, right_thunk: Callable[[], bool | None]) -> bool | None:
    if left is False:
        return False
    right = right_thunk()
    if right is False:
        return False
    return None if None in (left, right) else True


def ref_or(left: bool | None, right_thunk: Callable[[], bool | None]) -> bool | None:
    if left is True:
        return True
    right = right_thunk()
    if right is True:
        return True
    return None if None in (left, right) else False


def ref_eval(node: Node, props: dict[str, str]) -> bool | None:
    match node:
        case Cmp(op, left, right):
            lv, rv = java_value(left, props), java_value(right, props)
            if op == "=":
                return ref_equal(lv, rv)
            if op == "<>":
                eq = ref_equal(lv, rv)
                return None if eq is None else not eq
            return ref_order(op, lv, rv)
        case Between(negated, value, low, high):
            v, lo, hi = (java_value(x, props) for x in (value, low, high))
            if negated:
                return ref_or(ref_order("<", v, lo), lambda: ref_order(">", v, hi))
            return ref_and(ref_order(">=", v, lo), lambda: ref_order("<=", v, hi))
        case In(negated, value, members):
            if value.name not in props:
                return None
            return (props[value.name] in members) != negated
        case IsNull(negated, value):
            return (value.name not in props) != negated
        case Const(value):
            return value
        case Bare(value):
            return None if value.name not in props else False
        case Not(operand):
            inner = ref_eval(operand, props)
            return None if inner is None else not inner
        case And(first, second):
            return ref_and(ref_eval(first, props), lambda: ref_eval(second, props))
        case Or(first, second):
            return ref_or(ref_eval(first, props), lambda: ref_eval(second, props))
    raise AssertionError(node)


def rejected_at_parse(node: Node) -> bool:
    """Whether RocketMQ rejects the tree: only BETWEEN with two reversed literal bounds."""
    match node:
        case Between(False, _, IntLit() | DecLit() as low, IntLit() | DecLit() as high):
            literal = low.value >= 0 and high.value >= 0  # a negative bound is a negation
            return literal and high.value < low.value
        case Not(operand):
            return rejected_at_parse(operand)
        case And(left, right) | Or(left, right):
            return rejected_at_parse(left) or rejected_at_parse(right)
    return False


props_ = st.builds(Prop, st.sampled_from(NAMES))
ints = st.builds(IntLit, st.sampled_from(INT_POOL + [-v for v in INT_POOL if v]))
decimals = st.builds(DecLit, st.sampled_from(DECIMAL_POOL + [-v for v in DECIMAL_POOL]))
strings = st.builds(StrLit, st.sampled_from(WORDS))
bools = st.builds(BoolLit, st.booleans())
orderable = st.one_of(props_, ints, decimals)
any_operand = st.one_of(props_, ints, decimals, strings, bools)

comparisons = st.one_of(
    st.builds(Cmp, st.sampled_from(["<", "<=", ">", ">="]), orderable, orderable),
    st.builds(Cmp, st.sampled_from(["=", "<>"]), any_operand, any_operand).filter(
        # RocketMQ rejects TRUE = 'x' (a boolean literal, then a non-boolean one).
        lambda c: not (isinstance(c.left, BoolLit) and isinstance(c.right, LITERALS))
    ),
)
leaves = st.one_of(
    comparisons,
    st.builds(Between, st.booleans(), props_, orderable, orderable),
    st.builds(
        In,
        st.booleans(),
        props_,
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(tuple),
    ),
    st.builds(IsNull, st.booleans(), props_),
    st.builds(Const, st.booleans()),
    st.builds(Bare, props_),
)
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.builds(Not, children),
        st.builds(And, children, children),
        st.builds(Or, children, children),
    ),
    max_leaves=8,
)
messages = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(WORDS))


@settings(max_examples=300, deadline=None)
@given(tree=trees, upper=st.booleans(), cases=st.lists(messages, min_size=1, max_size=4))
def test_matches_reference_model(tree: Node, upper: bool, cases: list[dict[str, str]]) -> None:
    text = render(tree, upper)
    if rejected_at_parse(tree):
        with pytest.raises(Sql92ParseError):
            compile_sql92(text)
        return
    compiled = compile_sql92(text)
    for props in cases:
        try:
            want: Outcome = ref_eval(tree, props)
        except RefError:
            want = ERR
        assert outcome(text, props) == want, (text, props)
        assert compiled.matches(props) is (want is True)

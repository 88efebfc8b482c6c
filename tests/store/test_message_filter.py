"""Message filters: the two checks of RocketMQ's ExpressionMessageFilter."""

from __future__ import annotations

import pytest

from basalt.common.message import Message, encode_properties
from basalt.store.errors import StoreError
from basalt.store.hashing import java_string_hash, tags_code
from basalt.store.message_filter import (
    MessageFilter,
    Sql92Filter,
    TagFilter,
    UnknownFilterTypeError,
    build_filter,
)
from basalt.store.sql92 import Sql92LimitError, Sql92ParseError


def record_properties(tags: str | None = None, **extra: str) -> bytes:
    """The properties block the CommitLog holds for such a message."""
    return Message(topic="t", tags=tags, keys=["k1"], properties=dict(extra)).encoded_properties()


def passes(message_filter: MessageFilter, tags: str | None, **extra: str) -> bool:
    """Both checks in pull-loop order, as the store would run them."""
    if not message_filter.is_matched_by_consume_queue(tags_code(tags)):
        return False
    if not message_filter.needs_commit_log_check:
        return True
    return message_filter.is_matched_by_commit_log(record_properties(tags, **extra))


# --- TAG ----------------------------------------------------------------------


@pytest.mark.parametrize("expression", ["*", "", "   ", " * "])
def test_star_and_empty_subscribe_to_everything(expression: str) -> None:
    f = TagFilter.parse(expression)
    assert f.subscribe_all
    assert not f.needs_commit_log_check
    for tags in ("a", "zzz", None):
        assert f.is_matched_by_consume_queue(tags_code(tags))
        assert f.is_matched_by_commit_log(record_properties(tags))
    assert f.is_matched_by_commit_log(b"")


def test_tags_split_on_double_bar_and_strip() -> None:
    f = TagFilter.parse(" a ||b||  c c  || ||")
    assert not f.subscribe_all
    assert f.needs_commit_log_check
    assert f.tags == frozenset({"a", "b", "c c"})
    # Java: "a".hashCode() == 97, "c c".hashCode() == 99*31*31 + 32*31 + 99.
    assert f.codes == frozenset({97, 98, 96230})
    assert [passes(f, t) for t in ("a", "b", "c c", "c", "d", "A", None)] == [
        True,
        True,
        True,
        False,
        False,
        False,
        False,
    ]


def test_single_tag() -> None:
    f = TagFilter.parse("TagA")
    assert f.is_matched_by_consume_queue(java_string_hash("TagA"))
    assert not f.is_matched_by_consume_queue(java_string_hash("TagB"))
    assert not f.is_matched_by_consume_queue(0)  # a message without a tag
    assert f.is_matched_by_commit_log(record_properties("TagA"))
    assert not f.is_matched_by_commit_log(record_properties(None))
    assert not f.is_matched_by_commit_log(b"")


def test_a_subscription_naming_no_tag_matches_nothing_as_in_rocketmq() -> None:
    f = TagFilter.parse("||")
    assert not f.subscribe_all
    assert f.tags == frozenset()
    assert not passes(f, "a")
    assert not passes(f, None)


def test_colliding_hashes_are_told_apart_by_the_commit_log_check() -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    f = TagFilter.parse("Aa")
    # The ConsumeQueue only has the hash: both pass the first check.
    assert f.is_matched_by_consume_queue(tags_code("Aa"))
    assert f.is_matched_by_consume_queue(tags_code("BB"))
    # The CommitLog has the tag itself: only the subscribed one passes.
    assert f.is_matched_by_commit_log(record_properties("Aa"))
    assert not f.is_matched_by_commit_log(record_properties("BB"))
    assert passes(f, "Aa")
    assert not passes(f, "BB")


def test_commit_log_check_reads_the_tags_property_not_a_lookalike() -> None:
    f = TagFilter.parse("a")
    # XTAGS=a must not count as TAGS=a; a value containing the tag is not it.
    assert not f.is_matched_by_commit_log(encode_properties({"XTAGS": "a", "TAGS": "b"}))
    assert not f.is_matched_by_commit_log(encode_properties({"TAGS": "ab"}))
    assert f.is_matched_by_commit_log(encode_properties({"KEYS": "TAGS", "TAGS": "a"}))


def test_non_ascii_tags() -> None:
    f = TagFilter.parse("订单 || café")
    assert passes(f, "订单")
    assert passes(f, "café")
    assert not passes(f, "cafe")


def test_tag_filter_is_immutable_and_comparable() -> None:
    assert TagFilter.parse("a || b") == TagFilter.parse("b||a")
    with pytest.raises(AttributeError):
        TagFilter.parse("a").subscribe_all = True  # type: ignore[misc]


# --- SQL92 --------------------------------------------------------------------


def test_sql92_filter_passes_every_consume_queue_entry() -> None:
    f = Sql92Filter("TAGS = 'a'")
    assert f.needs_commit_log_check
    assert f.is_matched_by_consume_queue(0)
    assert f.is_matched_by_consume_queue(java_string_hash("b"))


def test_sql92_filter_evaluates_the_record_properties() -> None:
    f = Sql92Filter("TAGS = 'a' AND price > 10")
    assert f.expression == "TAGS = 'a' AND price > 10"
    assert f.is_matched_by_commit_log(record_properties("a", price="11"))
    assert not f.is_matched_by_commit_log(record_properties("a", price="9"))
    assert not f.is_matched_by_commit_log(record_properties("b", price="11"))
    assert not f.is_matched_by_commit_log(record_properties("a"))  # UNKNOWN
    assert not f.is_matched_by_commit_log(record_properties("a", price="cheap"))  # throws
    assert not f.is_matched_by_commit_log(b"")


def test_sql92_filter_sees_keys_and_user_properties() -> None:
    assert Sql92Filter("KEYS = 'k1' AND region IN ('eu')").is_matched_by_commit_log(
        record_properties(None, region="eu")
    )
    assert Sql92Filter("TAGS IS NULL").is_matched_by_commit_log(record_properties(None))


def test_sql92_filter_rejects_a_bad_expression() -> None:
    with pytest.raises(Sql92ParseError) as caught:
        Sql92Filter("TAGS = AND")
    assert caught.value.position == 7
    assert repr(Sql92Filter("TRUE")) == "Sql92Filter('TRUE')"


# --- build_filter ---------------------------------------------------------------


def test_build_filter_by_type() -> None:
    tag = build_filter("TAG", "a || b")
    assert isinstance(tag, TagFilter)
    assert tag.tags == frozenset({"a", "b"})
    assert isinstance(build_filter("", "a"), TagFilter)  # ExpressionType.isTagType
    sql = build_filter("SQL92", "a > 1")
    assert isinstance(sql, Sql92Filter)
    assert sql.is_matched_by_commit_log(encode_properties({"a": "2"}))


def test_build_filter_checks_and_parses_each_sql92_expression_once() -> None:
    # The store-node builds a filter for every read: a subscription's expression
    # must not be checked and parsed again with each one.
    text = "a > 1 AND region = 'cached-once'"
    first = build_filter("SQL92", text)
    assert build_filter("SQL92", text) is first
    with pytest.raises(Sql92LimitError, match="over the SQL92 terms limit of 256"):
        build_filter("SQL92", " OR ".join(["a"] * 200))


@pytest.mark.parametrize("kind", ["sql92", "tag", "CLASS", "XPATH", " TAG"])
def test_build_filter_rejects_an_unknown_type(kind: str) -> None:
    with pytest.raises(UnknownFilterTypeError) as caught:
        build_filter(kind, "a")
    assert caught.value.kind == kind
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, StoreError)
    assert "expected 'TAG' or 'SQL92'" in str(caught.value)


def test_build_filter_sql92_needs_an_expression() -> None:
    with pytest.raises(Sql92ParseError, match="empty expression"):
        build_filter("SQL92", "")

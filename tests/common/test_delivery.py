"""common.delivery: a stored message's delivery time from its properties, and its
DELAY rule held to the store's (the tagsCode of a parked record is its due time)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from basalt.common.delivery import delay_level, delivery_time_ms
from basalt.common.message import SCHEDULE_TOPIC, encode_properties
from basalt.store.config import parse_delay_levels
from basalt.store.schedule import consume_queue_tags_code

DELAYS = parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h")
STORED = 1_700_000_000_000


def test_a_delay_level_is_due_its_delay_after_the_store_time() -> None:
    assert delivery_time_ms({"DELAY": "3"}, STORED, DELAYS) == STORED + 10_000
    assert delivery_time_ms({"DELAY": "18"}, STORED, DELAYS) == STORED + 7_200_000
    # Past the last level is the last, as the store clamps it.
    assert delivery_time_ms({"DELAY": "40"}, STORED, DELAYS) == STORED + 7_200_000
    # Not a level: no delay (the store's reading), or an unknown table.
    for raw in ("0", "-1", "x", "", "1234567890", "³"):
        assert delivery_time_ms({"DELAY": raw}, STORED, DELAYS) is None, raw
    assert delivery_time_ms({"DELAY": "3"}, STORED, ()) is None


def test_timers_absolute_relative_and_stamped() -> None:
    at = STORED + 123_456
    assert delivery_time_ms({"TIMER_DELIVER_MS": str(at)}, STORED, DELAYS) == at
    assert delivery_time_ms({"__STARTDELIVERTIME": str(at)}, STORED, DELAYS) == at
    assert delivery_time_ms({"TIMER_DELAY_SEC": "90"}, STORED, DELAYS) == STORED + 90_000
    assert delivery_time_ms({"TIMER_DELAY_MS": "250"}, STORED, DELAYS) == STORED + 250
    # A past time is returned as it is (delivered at once).
    assert delivery_time_ms({"TIMER_DELIVER_MS": "5"}, STORED, DELAYS) == 5
    # The stamped due time wins over what it was computed from; absolute before
    # relative, as the store reads them; a delay level over every timer.
    both = {"TIMER_DELAY_SEC": "1", "TIMER_DELIVER_MS": str(at)}
    assert delivery_time_ms(both, STORED, DELAYS) == at
    assert delivery_time_ms({**both, "TIMER_OUT_MS": "77"}, STORED, DELAYS) == 77
    assert delivery_time_ms({**both, "DELAY": "1"}, STORED, DELAYS) == STORED + 1000
    # Malformed values are skipped; nothing scheduled is None.
    assert delivery_time_ms({"TIMER_DELIVER_MS": "soon"}, STORED, DELAYS) is None
    assert delivery_time_ms({"TIMER_DELAY_SEC": "1.5", "TIMER_DELIVER_MS": "9"}, STORED, ()) == 9
    assert delivery_time_ms({"TAGS": "a"}, STORED, DELAYS) is None


@given(st.text(max_size=12) | st.from_regex(r"[0-9]{1,11}", fullmatch=True))
def test_a_parked_records_tags_code_is_the_due_time_read_here(raw: str) -> None:
    # The store reads DELAY from the record's property bytes: the same level.
    assert delay_level(raw) == delay_level(raw.encode("utf-8"))
    # A parked record's ConsumeQueue tagsCode is the due time this module reads.
    level = delay_level(raw)
    if level > 0:
        props = encode_properties({"DELAY": raw})
        tags_code = consume_queue_tags_code(SCHEDULE_TOPIC, props, STORED, DELAYS)
        assert delivery_time_ms({"DELAY": raw}, STORED, DELAYS) == tags_code

"""admin.verbs' output: dates in tables, JSON-only columns, totals outside the rows, help."""

from __future__ import annotations

import pytest

from basalt.admin import verbs
from basalt.admin.cli import main


def test_times_are_iso_8601_utc_with_their_milliseconds() -> None:
    assert verbs.iso_time(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"
    # Every millisecond comes out as itself.
    assert all(verbs.iso_time(1_700_000_000_000 + ms).endswith(f".{ms:03d}Z") for ms in range(1000))
    assert verbs.iso_time(0) == "" and verbs.iso_time(-1) == ""  # never stored


def test_a_table_leaves_out_the_json_only_columns() -> None:
    header = ["queue", "last_update", "last_update_ms"]
    rows = [[0, "2023-11-14T22:13:20.123Z", 1_700_000_000_123]]
    table = verbs.format_table(header, rows)
    assert "last_update_ms" not in table and "1700000000123" not in table
    assert table.splitlines()[2].split() == ["0", "2023-11-14T22:13:20.123Z"]
    assert verbs.json_document(header, rows) == [dict(zip(header, rows[0], strict=True))]


def test_a_total_row_is_kept_out_of_the_json_list() -> None:
    header = ["topic", "queue", "broker_offset", "lag"]
    rows = [["T", 0, 5, 1], ["T", 1, 7, 0], [verbs.TOTAL, "", 12, 1]]
    assert verbs.json_document(header, rows) == {
        "queues": [
            {"topic": "T", "queue": 0, "broker_offset": 5, "lag": 1},
            {"topic": "T", "queue": 1, "broker_offset": 7, "lag": 0},
        ],
        "total": {"broker_offset": 12, "lag": 1},
    }
    assert verbs.format_table(header, rows).splitlines()[-1].split() == ["(total)", "12", "1"]


def test_reset_offset_by_time_help_says_now_leaves_lag_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["admin", "resetOffsetByTime", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "`now` leaves lag 1 per non-empty queue" in help_text and "-1 skips" in help_text

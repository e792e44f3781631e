"""`bgq consume -p`: N, A-B, -B, A- against the configured priorities (SPEC B §10, §13.3; checklist 94)."""

from __future__ import annotations

import pytest

from bgq import BgqError
from bgq.broker import parse_priorities

AVAILABLE = [10, 15, 20, 25, 30, 35, 40]


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("20-30", [20, 25, 30]),
        ("-30", [10, 15, 20, 25, 30]),
        ("20-", [20, 25, 30, 35, 40]),
        (None, AVAILABLE),
        ("", AVAILABLE),
        ("25", [25]),
        (" 15-15 ", [15]),
        ("-", AVAILABLE),  # both sides empty: first to last
    ],
)
def test_ranges(option, expected):
    assert parse_priorities(option, AVAILABLE) == expected


def test_result_keeps_the_configured_order():
    assert parse_priorities("1-3", [3, 1, 2]) == [3, 1, 2]


def test_single_priority_not_available():
    expected = r"^Priority 5 is not in available priorities \[10,15,20,25,30,35,40\]$"
    with pytest.raises(BgqError, match=expected):
        parse_priorities("5", AVAILABLE)


def test_range_without_intersection():
    with pytest.raises(
        BgqError, match=r"^Priority 20-25 has not intersections with availables priorities \[10,30,35,40\]$"
    ):
        parse_priorities("20-25", [10, 30, 35, 40])


@pytest.mark.parametrize("option", ["a", "1-b", "x-", "1-2-3", "--", "1.5"])
def test_invalid_input_is_a_clear_error(option):
    with pytest.raises(BgqError):
        parse_priorities(option, AVAILABLE)

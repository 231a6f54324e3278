"""Numbers for people, worked out by hand: never an exponent, whatever the size."""

from __future__ import annotations

import re

import pytest

from workbench.analysis.measured.units import gib, number, percent, rate, ratio, seconds

EXPONENT = re.compile(r"e[+-]\d\d")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (rate(21005.4), "21,005/s"),
        (rate(12.5), "12.5/s"),
        (rate(0.00001), "0.00001/s"),
        (seconds(12345.0), "12,345 s"),
        (seconds(2.4), "2.4 s"),
        (seconds(0.00152), "1.52 ms"),
        (seconds(0.00034), "340 us"),
        (seconds(0.9996), "1 s"),  # rounds up to the next unit, not to 1,000 ms
        (gib(0.31 * 2**30), "0.31 GiB"),
        (gib(140 * 2**30), "140 GiB"),  # an H200's memory: '%.2g' said 1.4e+02
        (percent(0.7788), "78 %"),
        (percent(0.004), "0.4 %"),
        (ratio(0.5812), "0.58x"),
        (number(15290.2), "15,290"),
        (number(0.0001726), "0.000173"),
    ],
)
def test_units_for_people(text: str, expected: str) -> None:
    assert text == expected
    assert not EXPONENT.search(text)

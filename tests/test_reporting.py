"""What a reader is shown: intervals only from enough clusters, never NaN or degenerate."""

import math

import pandas as pd
import pytest

from rlprobe_nb import reporting as rp


@pytest.mark.parametrize("x, digits, signed, want", [
    (0.34217, 3, False, "0.342"), (-0.0386, 3, True, "-0.0386"), (0.0386, 3, True, "+0.0386"),
    (12.345, 3, False, "12.3"), (1234.5, 3, False, "1234"), (0, 3, True, "+0"),
    (3e-7, 3, False, "3.0e-07"), (float("nan"), 3, False, "n/a"), (math.inf, 3, False, "n/a"),
    (None, 3, False, "n/a"), (1.0, 3, False, "1.00"),
])
def test_fmt(x, digits, signed, want):
    assert rp.fmt(x, digits, signed) == want


def test_interval_needs_enough_clusters():
    assert rp.interval_text(0.342, 0.301, 0.388, 12) == "0.342 [0.301, 0.388]"
    text = rp.interval_text(0.342, 0.301, 0.388, 3)
    assert text.startswith("0.342 (3 problems: too few") and "[" not in text


@pytest.mark.parametrize("low, high, why", [
    (float("nan"), float("nan"), "not finite"), (0.0, 0.0, "same value"),
    (0.4, 0.5, "does not contain"), (-math.inf, 1.0, "not finite"),
])
def test_no_interval_that_says_nothing_or_excludes_its_estimate(low, high, why):
    text = rp.interval_text(0.342, low, high, 20)
    assert why in text and "nan" not in text.lower() and "inf" not in text and "[" not in text


def test_missing_estimate_is_no_data():
    assert rp.interval_text(float("nan"), 0, 1, 20) == "no data"


def test_excludes_zero_only_with_a_shown_interval():
    assert rp.excludes_zero(-1.2, -2.0, -0.5, 10)
    assert not rp.excludes_zero(-1.2, -2.0, -0.5, 4)
    assert not rp.excludes_zero(0.1, -0.2, 0.4, 10)


def test_table_blanks_bounds_it_would_not_print():
    t = pd.DataFrame({"mean": [0.3, 0.2], "lo": [0.1, 0.1], "hi": [0.5, 0.3], "n": [8, 2]})
    out = rp.with_interval_text(t, "mean", "lo", "hi", "n")
    assert out["interval"].tolist()[0] == "0.300 [0.100, 0.500]"
    assert pd.isna(out.loc[1, "lo"]) and "too few" in out.loc[1, "interval"]

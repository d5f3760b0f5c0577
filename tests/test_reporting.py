"""What a reader is shown: intervals only from enough clusters, never NaN or degenerate."""

import math

import pandas as pd
import pytest

from rlprobe_nb import reporting as rp


@pytest.mark.parametrize("x, digits, signed, want", [
    (0.34217, 3, False, "0.342"), (-0.0386, 3, True, "-0.0386"), (0.0386, 3, True, "+0.0386"),
    (12.345, 3, False, "12.3"), (1234.5, 3, False, "1234"), (0, 3, True, "0"),
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


def test_scale_unit_and_one_problem():
    assert rp.interval_text(0.0716, 0.0377, 0.133, 8, scale=100, unit="%") == "7.16 [3.77, 13.3]%"
    text = rp.interval_text(0.0255, 0.01, 0.03, 1, scale=100, unit="%")
    assert text == "2.55% (1 problem: too few for an interval (needs 5))"


def test_row_text_reads_series_and_namedtuples():
    table = pd.DataFrame({"estimate": [0.3], "low": [0.2], "high": [0.4], "problems": [9]})
    assert rp.row_text(table.iloc[0]) == rp.row_text(next(table.itertuples())) == "0.300 [0.200, 0.400]"
    changes = table.rename(columns={"estimate": "change"})
    assert rp.row_text(changes.iloc[0], estimate="change", signed=True) == "+0.300 [+0.200, +0.400]"


def test_claims_need_a_shown_interval():
    assert rp.sign_of(-0.5, -0.8, -0.2, 9) == -1 and rp.sign_of(0.5, 0.2, 0.8, 9) == 1
    assert rp.sign_of(-0.5, -0.8, 0.2, 9) == 0 and rp.sign_of(-0.5, -0.8, -0.2, 4) == 0
    assert rp.contains(0.0, -0.1, -0.3, 0.1, 9) is True
    assert rp.contains(0.0, -0.2, -0.3, -0.1, 9) is False
    assert rp.contains(0.0, -0.2, -0.3, -0.1, 3) is None
    assert rp.verdict_text(True, 9) == "yes" and rp.verdict_text(False, 9) == "no"
    assert rp.verdict_text(None, 3) == "cannot tell (3 problems; an interval needs 5)"
    assert rp.verdict_text(None, 9) == "cannot tell (no interval)"


def test_the_fewest_problems_is_a_chapter_setting():
    try:
        rp.use_min_clusters(3)
        assert rp.interval_text(0.3, 0.2, 0.4, 3) == "0.300 [0.200, 0.400]"
        assert rp.interval_text(0.3, 0.2, 0.4, 3, min_clusters=5).startswith("0.300 (3 problems")
    finally:
        rp.use_min_clusters(5)
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError):
            rp.use_min_clusters(bad)


def test_display_table_shows_no_nan():
    t = pd.DataFrame({"name": ["a", None], "mean": [0.3, 0.2], "lo": [0.1, math.nan],
                      "hi": [0.5, math.nan], "n": [8, 2], "other": [math.nan, 1.23456]})
    out = rp.display_table(t, {"mean [95%]": ("mean", "lo", "hi", "n", {"signed": True})})
    assert list(out.columns) == ["name", "n", "other", "mean [95%]"]
    assert out["mean [95%]"].tolist()[0] == "+0.300 [+0.100, +0.500]"
    assert "too few" in out["mean [95%]"].tolist()[1]
    assert out.other.tolist() == ["–", "1.23"] and out.name.tolist() == ["a", "–"]
    rendered = out.to_string() + out.to_html()
    assert "nan" not in rendered.lower() and "<NA>" not in rendered

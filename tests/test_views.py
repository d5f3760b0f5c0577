"""Charts answer a hover (``views.readable_tooltips``): every mark but text has a tooltip whose
numbers have four significant digits and whose fields are named; lines and areas get points
to hover. The browser tests hover every chart of the small book (``test_book_pages``)."""

import re

import altair as alt
import pandas as pd
import vl_convert

from rlprobe_nb import views

DATA = pd.DataFrame({"step": [0, 100, 1200], "estimate": [0.0605466100921, 0.25, 1.5],
                     "low": [0.01, 0.1, 1.0], "high": [0.1, 0.4, 2.0], "group": ["a", "b", "c"]})


def units(spec: dict) -> list[dict]:
    """Every unit spec (one with a mark) of a Vega-Lite dict, in order."""
    out = [spec] if "mark" in spec else []
    for key in ("layer", "hconcat", "vconcat", "concat"):
        for part in spec.get(key, []):
            out += units(part)
    return out + (units(spec["spec"]) if "spec" in spec else [])


def test_every_mark_but_text_gets_a_named_tooltip_with_four_significant_digits():
    base = alt.Chart(DATA).encode(x=alt.X("step:Q", title="RL step"))
    chart = alt.hconcat(
        alt.layer(base.mark_rule().encode(y="low:Q", y2="high:Q"),
                  base.mark_line().encode(y=alt.Y("estimate:Q", title=["mean KL,", "nats"]), color="group:N"),
                  base.mark_text().encode(y="estimate:Q", text="group:N")),
        alt.Chart(DATA).mark_bar().encode(x="group:N", y="estimate:Q", tooltip=["group", "estimate"]))
    rule, line, text, bar = units(views.readable_tooltips(chart.to_dict()))
    assert rule["encoding"]["tooltip"] == [  # numbers shown as text the chart computes
        {"field": "step (shown)", "type": "nominal", "title": "RL step"},
        {"field": "low (shown)", "type": "nominal", "title": "95% interval, low"},
        {"field": "high (shown)", "type": "nominal", "title": "95% interval, high"}]
    assert [t["as"] for t in rule["transform"]] == ["step (shown)", "low (shown)", "high (shown)"]
    assert [t["title"] for t in line["encoding"]["tooltip"]] == ["RL step", "mean KL, nats", "group"]
    assert line["mark"]["point"] == views.HOVER_POINTS, "a line's path answers no hover in SVG: its points do"
    assert "tooltip" not in text["encoding"], "a label answers only where the chart says so"
    assert [t["field"] for t in bar["encoding"]["tooltip"]] == ["group", "estimate (shown)"], "the chart's own"


def test_tooltip_numbers_read_with_four_digits_and_tiny_ones_in_scientific_notation():
    """The expression the tooltips show their numbers with, drawn by Vega itself (vl-convert)
    as text marks: what a hover shows."""
    values = [0.0605466100921, 1200.0, 1.234567e-05, -2.5e-07, 0.0, 0.001, float("nan")]
    data = pd.DataFrame({"row": list("abcdefg"), "v": values})  # row names: no digit of their own
    chart = alt.Chart(data).mark_text().encode(y="row:N", text="v (shown):N").transform_calculate(
        **{"v (shown)": views.SHOWN_NUMBER.format(field="v")})
    svg = vl_convert.vegalite_to_svg(chart.to_dict())
    shown = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    for want in ("0.06055", "1,200", "1.235e-5", "−2.5e-7", "0", "0.001", "–"):
        assert want in shown, (want, shown)


def test_a_faceted_chart_names_its_panel_in_the_tooltip():
    chart = alt.Chart(DATA).mark_point().encode(x="step:Q", y="estimate:Q").facet(column="group:N")
    (unit,) = units(views.readable_tooltips(chart.to_dict()))
    assert [t["field"] for t in unit["encoding"]["tooltip"]] == ["group", "step (shown)", "estimate (shown)"]


def test_the_shown_chart_carries_the_tooltips_into_jupyterlab_and_the_pages():
    shown = views.show(alt.Chart(DATA).mark_line().encode(x="step:Q", y="estimate:Q"))
    spec = shown._repr_mimebundle_()[views.VEGALITE_MIMETYPE]
    assert spec["encoding"]["tooltip"][1]["field"] == "estimate (shown)"
    assert any(t.get("as") == "estimate (shown)" for t in spec["transform"])


def test_a_token_with_a_control_character_renders_and_saves(tmp_path):
    """A token's text may hold C0 controls XML forbids (\\x14, \\x0c): the SVG and PNG
    renderer refused the whole chart (seen on a real TRL run's tokens); they are shown
    as their Control Pictures marks instead."""
    import altair as alt

    df = pd.DataFrame({"token": ["a\x14b", "\x0cff", "ok\n"], "x": [1, 2, 3]})
    chart = alt.Chart(df).mark_bar().encode(x="x:Q", y="token:N", tooltip=["token"])
    views.show(chart, save_as=tmp_path / "controls")
    svg = (tmp_path / "controls.svg").read_text()
    assert "\u2414" in svg and "\u240c" in svg
    assert (tmp_path / "controls.png").stat().st_size > 0

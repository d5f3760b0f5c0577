"""The renderer: a colour scale fixed once for a suite, and a response as coloured spans
whose text is the response, whose colours are their values on that scale, whose tooltips
carry the table's numbers, and in which model text stays text."""

import html
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from rlprobe_nb.render import colour_scale as cs
from rlprobe_nb.render import spike_marks, synthetic, tokens_html
from rlprobe_nb.render.metrics import METRICS, metric_values
from rlprobe_nb.render.page_runtime import runtime_script


@pytest.fixture(scope="module")
def suite():
    return synthetic.synthetic_suite(n_problems=2, rollouts_per_problem=2, n_tokens=50, seed=1)


def one(suite, checkpoint="rlvr_step_1200", rollout="synthetic/0#0"):
    t = suite["tokens"]
    rows = t[(t.checkpoint == checkpoint) & (t.rollout_id == rollout)].sort_values("pos")
    response = suite["rollouts"].set_index("rollout_id").response[rollout]
    return rows, response


class Spans(HTMLParser):
    """Every token span: its attributes and its text; and every element that was opened."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.spans, self.tags, self._open = [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        attrs = dict(attrs)
        if tag == "span" and "rp-tok" in attrs.get("class", ""):
            self._open = {**attrs, "text": ""}

    def handle_data(self, data):
        if self._open is not None:
            self._open["text"] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.spans.append(self._open)
            self._open = None


def parse(fragment: str) -> Spans:
    p = Spans()
    p.feed(fragment)
    return p


def test_shared_scale_is_the_quantile_of_the_whole_suite(suite):
    t = suite["tokens"]
    scale = cs.shared_scale(t, "kl_ref_ckpt", quantile=0.95)
    rows = t[~t.first_token]
    expected = np.quantile(np.abs(rows.kl_ref_ckpt.to_numpy(np.float64)), 0.95)
    assert scale.vmax == pytest.approx(expected, rel=1e-12)
    assert "Shared by every checkpoint and rollout" in scale.describe() and "at 3 checkpoints." in scale.describe()
    # the same object colours every checkpoint: a value has one colour wherever it occurs
    assert scale.colours([0.3])[0] == scale.colours(np.array([0.3, 0.1]))[0]


def test_signed_scale_is_diverging_and_clips():
    s = cs.ColourScale("dlogp", 2.0)
    ends = s.colours([-2.0, 0.0, 2.0, -50.0, 50.0, np.nan])
    assert ends[:3] == [cs.DIVERGING[0], cs.DIVERGING[4], cs.DIVERGING[-1]]
    assert ends[3] == ends[0] and ends[4] == ends[2], "beyond the scale: the end colour"
    assert ends[5] == cs.MISSING
    u = cs.ColourScale("kl_ref_ckpt", 1.0)
    assert u.colours([0.0, 1.0]) == [cs.SEQUENTIAL[0], cs.SEQUENTIAL[-1]]


def test_interpolation_between_anchors_in_float64():
    s = cs.ColourScale("kl_ckpt_ref", 8.0)  # 9 anchors: value 0.5 is half way between anchors 0 and 1
    a, b = cs._anchors(cs.SEQUENTIAL)[:2]
    assert s.rgb([0.5]).tolist() == [np.rint((a + b) / 2).astype(int).tolist()]


def test_log_transform_is_monotone_and_invertible():
    s = cs.ColourScale("dlogp", 4.0, transform="log")
    v = np.linspace(-4, 4, 101)
    t = s.position(v)
    assert np.all(np.diff(t) > 0) and t[0] == -1 and t[-1] == 1
    np.testing.assert_allclose(s.value_at(t), v, atol=1e-12)
    assert abs(s.position([0.04])[0]) > abs(cs.ColourScale("dlogp", 4.0).position([0.04])[0]), (
        "the log scale spreads small values")


def test_metrics_derived_when_absent(suite):
    rows, _ = one(suite)
    bare = rows.drop(columns=["dlogp"])
    np.testing.assert_allclose(metric_values(bare, "dlogp"),
                               rows.logp_ckpt.astype(np.float64) - rows.logp_ref.astype(np.float64))
    np.testing.assert_allclose(metric_values(rows, "dentropy"),
                               rows.entropy_ckpt.astype(np.float64) - rows.entropy_ref.astype(np.float64))
    for name in ("kl_ref_ckpt", "kl_ckpt_ref", "js"):
        np.testing.assert_array_equal(metric_values(rows, name), rows[name].to_numpy(np.float64))
    assert "surprised" in METRICS["kl_ref_ckpt"].label and "surprised" in METRICS["kl_ckpt_ref"].label
    with pytest.raises(ValueError, match="unknown metric"):
        metric_values(rows, "kl")


@pytest.mark.parametrize("metric", list(METRICS))
def test_spans_tile_the_response_and_colours_match_the_scale(suite, metric):
    rows, response = one(suite)
    scale = cs.shared_scale(suite["tokens"], metric)
    p = parse(tokens_html.response_html(rows, scale, synthetic.decode, response, suite["spikes"]))
    assert len(p.spans) == len(rows)
    assert "".join(s["text"] for s in p.spans) == response
    values = metric_values(rows, metric)
    want = scale.colours(values)
    got = [re.search(r"background:(#[0-9a-f]{6})", s["style"]).group(1) for s in p.spans]
    assert got == want
    assert [int(s["data-pos"]) for s in p.spans] == rows.pos.tolist()


def test_model_text_is_escaped():
    rows = synthetic.synthetic_suite(n_problems=1, rollouts_per_problem=1, n_tokens=8, seed=2)["tokens"]
    rows = rows[rows.checkpoint == rows.checkpoint.iloc[0]].copy()
    evil = ['<script>alert(1)</script>', '<b>bold</b>', '" onmouseover="x', "&amp;", "\n", " ", "é", ""]
    rows["token"] = evil
    starts = np.cumsum([0] + [len(e) for e in evil[:-1]])
    rows["char_start"], rows["char_end"] = starts, starts + [len(e) for e in evil]
    fragment = tokens_html.response_html(rows, cs.ColourScale("dlogp", 1.0), {i: "<i>" for i in range(100)})
    p = parse(fragment)
    assert "b" not in p.tags and "i" not in p.tags
    assert p.tags.count("script") == 1 and fragment.count(runtime_script()) == 1, "only the page runtime"
    assert "alert(1)" not in fragment.replace(runtime_script(), "").replace("&lt;script&gt;alert(1)", "")
    assert [s["text"] for s in p.spans] == evil
    assert all("onmouseover" not in s for s in p.spans)
    assert '"<i>"' in p.spans[0]["data-tip"], "decoded alternatives are text too"


def tooltip_numbers(tip: str) -> dict:
    grab = lambda pat: [float(x) for x in re.search(pat, tip).groups()]
    out = {}
    out["logp_ref"], out["logp_ckpt"], out["dlogp"] = grab(r"log p\s+ref (\S+)\s+ckpt (\S+)\s+Δlogp (\S+)")
    out["rank_ref"], out["rank_ckpt"] = grab(r"rank\s+ref (\d+)\s+ckpt (\d+)")
    out["kl_ref_ckpt"], out["kl_ckpt_ref"], out["js"] = grab(r"KL\(ref‖ckpt\) (\S+)\s+KL\(ckpt‖ref\) (\S+)\s+JS (\S+)")
    out["entropy_ref"], out["entropy_ckpt"] = grab(r"entropy\s+ref (\S+)\s+ckpt (\S+)")
    return out


def test_tooltips_carry_the_tables_numbers_and_both_topk(suite):
    rows, response = one(suite)
    p = parse(tokens_html.response_html(rows, cs.ColourScale("dlogp", 1.0), synthetic.decode, response,
                                        suite["spikes"]))
    for span, row in zip(p.spans, rows.itertuples()):
        tip = span["data-tip"]
        assert tip.startswith(f'{tokens_html.show_token(response[row.char_start:row.char_end])}  id {row.token_id}  pos {row.pos}')
        for col, shown in tooltip_numbers(tip).items():
            want = (row.logp_ckpt - row.logp_ref) if col == "dlogp" else getattr(row, col)
            assert shown == pytest.approx(float(want), abs=0.5e-4 + 1e-7), col
        lines = tip.splitlines()
        top = lines[lines.index(next(l for l in lines if l.startswith("top-"))) + 1:]
        assert len(top) == 5
        for j, line in enumerate(top):
            ref_tok = tokens_html.show_token(synthetic.decode(int(row.topk_ids_ref[j])))[:18]
            ck_tok = tokens_html.show_token(synthetic.decode(int(row.topk_ids_ckpt[j])))[:18]
            assert f"{ref_tok:<18} {row.topk_p_ref[j]:.3f}" in line and f"{ck_tok:<18} {row.topk_p_ckpt[j]:.3f}" in line


def test_spikes_outlined_with_class_q_and_onset(suite):
    rows, response = one(suite)
    spikes = suite["spikes"]
    mine = spikes[(spikes.checkpoint == "rlvr_step_1200") & (spikes.rollout_id == "synthetic/0#0") & spikes.significant]
    assert len(mine) >= 1
    p = parse(tokens_html.response_html(rows, cs.ColourScale("dlogp", 1.0), synthetic.decode, response, spikes))
    outlined = {int(s["data-pos"]) for s in p.spans if "rp-spike" in s["class"]}
    assert outlined == set(mine.pos)
    for sp in mine.itertuples():
        tip = next(s["data-tip"] for s in p.spans if int(s["data-pos"]) == sp.pos)
        assert f"spike {sp.sign}" in tip and f"q {sp.q:.3g}" in tip and f"onset step {sp.onset_step}" in tip
        assert f"category {sp.category}" in tip
    strict = parse(tokens_html.response_html(rows, cs.ColourScale("dlogp", 1.0), synthetic.decode, response, spikes,
                                             q_threshold=float(mine.q.min())))
    assert {int(s["data-pos"]) for s in strict.spans if "rp-spike" in s["class"]} == set(mine[mine.q == mine.q.min()].pos)


def test_fragment_is_self_contained(suite):
    rows, response = one(suite)
    fragment = tokens_html.response_html(rows, cs.shared_scale(suite["tokens"]), synthetic.decode, response)
    from rlprobe_nb.book import network_references

    assert fragment.count("<script") == 1 and fragment.count(runtime_script()) == 1, "only the inline runtime"
    assert network_references(fragment) == [] and "http" not in fragment and "@import" not in fragment
    assert fragment.count("<style>") == 1 and "rp-legend" in fragment


def test_decoders():
    assert tokens_html.make_decoder({5: "five"})(5) == "five"
    assert tokens_html.make_decoder({5: "five"})(6) == "#6"
    calls = []
    dec = tokens_html.make_decoder(lambda i: calls.append(i) or f"<{i}>")
    assert dec(3) == "<3>" and dec(3) == "<3>" and calls == [3], "a callable is asked once per id"
    table = pd.DataFrame({"token_id": [1, 2], "token": ["a", "b"]})
    assert tokens_html.make_decoder(None, table)(2) == "b"


def test_one_checkpoint_and_rollout_per_fragment(suite):
    t = suite["tokens"]
    with pytest.raises(ValueError, match="one checkpoint and one rollout"):
        tokens_html.response_html(t[t.rollout_id == "synthetic/0#0"], cs.ColourScale("dlogp", 1.0))


def test_html_escape_of_tooltip_survives_round_trip(suite):
    rows, response = one(suite)
    fragment = tokens_html.response_html(rows, cs.ColourScale("dlogp", 1.0), synthetic.decode, response)
    raw_tip = re.search(r'data-tip="([^"]*)"', fragment).group(1)
    assert "\n" in html.unescape(raw_tip) and "<" not in raw_tip


def test_spikes_found_by_context_whatever_rollout_names_them(suite):
    """A context shared by several rollouts is one row of the spikes table naming the first;
    every rollout with that context and written token shows it. Without context ids the
    rollout and position decide. Rows not significant at a step are not spikes there."""
    rows, _ = one(suite)
    sp = suite["spikes"]
    ours = sp[(sp.rollout_id == "synthetic/0#0") & (sp.checkpoint == "rlvr_step_1200")]
    renamed = ours.assign(rollout_id="synthetic/other#9", pos=999)
    found = spike_marks.spike_records(renamed, "rlvr_step_1200", rows)
    assert set(found) == set(ours[ours.significant].pos)
    assert spike_marks.spike_records(renamed.drop(columns="context_id"), "rlvr_step_1200", rows) == {}
    plain = spike_marks.spike_records(ours.drop(columns="context_id"), "rlvr_step_1200", rows)
    assert set(plain) == set(ours[ours.significant].pos)
    assert {r["sign"] for r in plain.values()} <= {"rejects", "endorses"}
    old_style = ours.rename(columns={"sign": "sign_class"}).drop(columns="significant")
    assert set(spike_marks.spike_records(old_style, "rlvr_step_1200", rows)) == set(ours.pos)

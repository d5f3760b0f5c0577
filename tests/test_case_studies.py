"""Case studies: the rule picks the same cases for the same seed whatever the row order, each
item of the rule picks what it says, and every number the page shows is the table's
(read back from the HTML)."""

import html
import json
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from test_render import Spans, tooltip_numbers

from rlprobe_nb.render import case_page, shared_scale, synthetic
from rlprobe_nb.render import case_studies as cs
from rlprobe_nb.render.tokens_html import show_token

FINAL = "rlvr_step_1200"


@pytest.fixture(scope="module")
def suite():
    return synthetic.synthetic_suite(n_problems=4, rollouts_per_problem=2, n_tokens=40, seed=5)


@pytest.fixture(scope="module")
def built(suite):
    rule = cs.CaseRule(n_categories=2, n_random=1, n_controls=1, seed=11, window=4)
    choices = cs.select_cases(suite["tokens"], suite["spikes"], rule)
    cases = cs.build_cases(choices, suite["tokens"], suite["spikes"], suite["problems"], suite["rollouts"],
                           suite["answers"], window=rule.window)
    page = case_page.case_studies_page(cases, shared_scale(suite["tokens"]), synthetic.decode, suite["spikes"])
    return choices, cases, page


def keys(choices):
    return list(zip(choices.kind, choices.rollout_id, choices.pos))


def test_same_seed_same_cases_whatever_the_row_order(suite):
    rule = cs.CaseRule(seed=7)
    first = cs.select_cases(suite["tokens"], suite["spikes"], rule)
    shuffled = cs.select_cases(suite["tokens"].sample(frac=1, random_state=1),
                               suite["spikes"].sample(frac=1, random_state=2), rule)
    pd.testing.assert_frame_equal(first, shuffled)
    assert len(first) == rule.n_categories + 1 + rule.n_random + rule.n_controls
    randoms = {keys(cs.select_cases(suite["tokens"], suite["spikes"], cs.CaseRule(seed=s)))[-2] for s in range(8)}
    assert len(randoms) > 1, "the seed decides the random spike"


def test_each_item_of_the_rule_picks_what_it_says(suite):
    tokens, spikes = suite["tokens"], suite["spikes"]
    rule = cs.CaseRule(n_categories=3, seed=3)
    got = cs.select_cases(tokens, spikes, rule)
    pool = spikes[(spikes.checkpoint == FINAL) & (spikes.group == "target") & (spikes.persistence == "persistent")
                  & spikes.significant]
    by_cat = pool.groupby("category").size()
    top_cats = sorted(by_cat.index, key=lambda c: (-by_cat[c], c))[:3]
    for row, cat in zip(got.itertuples(), top_cats):
        best = pool[pool.category == cat].statistic.abs().max()
        mine = pool[(pool.rollout_id == row.rollout_id) & (pool.pos == row.pos)]
        assert mine.category.iloc[0] == cat and abs(mine.statistic.iloc[0]) == best
    earliest = got.iloc[3]
    assert earliest.reason == "the earliest onset"
    taken = set(zip(got.rollout_id[:3], got.pos[:3]))
    rest = pool[[(r, p) not in taken for r, p in zip(pool.rollout_id, pool.pos)]]
    onset = pool[(pool.rollout_id == earliest.rollout_id) & (pool.pos == earliest.pos)].onset_step.iloc[0]
    assert onset == rest.onset_step.min()
    assert set(got.rollout_id).issubset(set(tokens[tokens.group == "target"].rollout_id))


def test_control_is_quiet_and_matched_on_reference_entropy(suite):
    tokens, spikes = suite["tokens"], suite["spikes"]
    got = cs.select_cases(tokens, spikes, cs.CaseRule(seed=4, control_pool=3))
    control = got[got.kind == "control"].iloc[0]
    assert (control.rollout_id, control.pos) not in set(zip(spikes.rollout_id, spikes.pos))
    final = tokens[(tokens.checkpoint == FINAL) & (tokens.group == "target")].set_index(["rollout_id", "pos"])
    me = final.loc[(control.rollout_id, control.pos)]
    assert abs(me.dlogp) <= np.median(np.abs(final.dlogp.astype(np.float64)))
    assert not me.first_token and not me.is_eos
    matched = got[got.case == control.matched_to].iloc[0]
    target = float(final.loc[(matched.rollout_id, matched.pos)].entropy_ref)
    quiet = final[~final.index.isin(list(zip(spikes.rollout_id, spikes.pos))) & ~final.first_token & ~final.is_eos
                  & (final.dlogp.abs() <= np.median(np.abs(final.dlogp.astype(np.float64))))]
    gaps = np.sort(np.abs(quiet.entropy_ref.astype(np.float64) - target))
    assert abs(float(me.entropy_ref) - target) <= gaps[2], "among the 3 nearest in reference entropy"


def test_case_content_comes_from_the_tables(built, suite):
    choices, cases, _ = built
    answers = suite["answers"]
    for case in cases:
        assert case.gold == suite["problems"].set_index("problem_id").answer[case.problem_id]
        r = suite["rollouts"].set_index("rollout_id").loc[case.rollout_id]
        assert (case.ref_answer, case.failure_type, case.response) == (r.extracted, r.failure_type, r.response)
        assert list(case.at_pos.step) == [100, 400, 1200]
        assert set(case.window.pos) == set(range(max(0, case.pos - 4), min(40, case.pos + 5)))
        mine = answers[answers.problem_id == case.problem_id]
        for a in case.answers.itertuples():
            sub = mine[mine.model == a.model]
            assert (a.n, a.n_correct) == (len(sub), int(sub.correct.sum()))
        assert list(case.answers.model) == ["dpo", "rlvr_step_100", "rlvr_step_400", "rlvr_step_1200"]


class Numbers(HTMLParser):
    """Each number tagged with its source, and the page's other visible text."""

    SKIP = {"style", "svg", "code", "pre", "script"}  # script: the page runtime, not text

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.numbers, self.text, self._stack = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        cls = attrs.get("class", "") or ""
        kind = ("num" if "rp-num" in cls else "skip" if tag in self.SKIP or "rp-tok" in cls
                or "rp-legend" in cls else None)
        self._stack.append((tag, kind, attrs))
        if kind == "num":
            self.numbers.append([json.loads(attrs["data-src"]), ""])

    def handle_endtag(self, tag):
        while self._stack:
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        kinds = [k for _, k, _ in self._stack]
        if "skip" in kinds:
            return
        if kinds and kinds[-1] == "num":
            self.numbers[-1][1] += data
        elif self._stack and self._stack[-1][0] != "title":
            self.text.append(data)


def tolerance(text: str) -> float:
    """Half a unit in the last digit shown."""
    mantissa, _, exp = text.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (-decimals + (int(exp) if exp else 0)) + 1e-12


def source_value(src: dict, suite, choices):
    if src["table"] == "tokens":
        t = suite["tokens"]
        row = t[(t.checkpoint == src["checkpoint"]) & (t.rollout_id == src["rollout_id"]) & (t.pos == src["pos"])]
        value = row[src["col"]].iloc[0]
        return float(value[src["index"]]) if "index" in src else float(value)
    if src["table"] == "spikes":
        s = suite["spikes"]
        row = s[(s.checkpoint == src["checkpoint"]) & (s.rollout_id == src["rollout_id"]) & (s.pos == src["pos"])]
        return float(row[src["col"]].iloc[0])
    if src["table"] == "answers":
        a = suite["answers"]
        a = a[(a.problem_id == src["problem_id"]) & (a.model == src["model"])]
        return {"n": len(a), "n_correct": int(a.correct.sum()),
                "count": int((a.extracted == src.get("answer")).sum())}[src["agg"]]
    if src["table"] == "case":
        return float(choices.set_index("case").pos[src["case"]])
    raise AssertionError(f"unknown source {src}")


def test_every_number_shown_is_the_tables(built, suite):
    choices, cases, page = built
    p = Numbers()
    p.feed(page)
    assert len(p.numbers) > 100
    for src, text in p.numbers:
        want = source_value(src, suite, choices)
        assert abs(float(text) - want) <= tolerance(text), (src, text, want)
    # no other number on the page: what is left are names (checkpoints, rollouts, problems)
    rest = " ".join(p.text)
    for name in [*suite["tokens"].checkpoint.unique(), *suite["tokens"].rollout_id.unique()]:
        rest = rest.replace(name, "")
    rest = re.sub(r"[Cc]ase \d+|seed \d+|top-5", "", rest)  # case numbers and the rule's seed
    stray = re.findall(r".{0,20}\d.{0,20}", rest)
    assert not stray, f"numbers without their source: {stray[:3]}"


def test_tooltips_and_text_of_every_coloured_block(built, suite):
    _, cases, page = built
    t = suite["tokens"].set_index(["checkpoint", "rollout_id", "pos"])
    blocks = re.findall(r'<div class="rp-resp" data-checkpoint="([^"]+)" data-rollout="([^"]+)"[^>]*>(.*?)</div>', page, re.S)
    assert len(blocks) == len(cases) * (1 + 3)
    for ckpt, rid, body in blocks:
        p = Spans()
        p.feed(body)
        response = suite["rollouts"].set_index("rollout_id").response[rid.replace("&#x27;", "'")]
        pos = [int(s["data-pos"]) for s in p.spans]
        rows = t.loc[[(ckpt, rid, q) for q in pos]]
        assert "".join(s["text"] for s in p.spans) == response[rows.char_start.iloc[0]:rows.char_end.iloc[-1]]
        for span, row in zip(p.spans, rows.itertuples()):
            for col, shown in tooltip_numbers(span["data-tip"]).items():
                want = row.logp_ckpt - row.logp_ref if col == "dlogp" else getattr(row, col)
                assert shown == pytest.approx(float(want), abs=0.5e-4 + 1e-7)


def test_caption_and_topk_name_the_models_choices(built):
    _, cases, page = built
    for case in cases:
        row = case.final_rows[case.final_rows.pos == case.pos].iloc[0]
        top = show_token(synthetic.decode(int(row.topk_ids_ckpt[0])))
        assert f"The checkpoint's first choice is <code>{html.escape(top)}</code>" in page


def test_page_is_self_contained(built):
    from rlprobe_nb.book import network_references
    from rlprobe_nb.render.page_runtime import runtime_script

    page = built[2]
    scripts = re.findall(r"<script>.*?</script>", page, re.S)
    assert scripts and set(scripts) == {runtime_script()}, "no script but the inline page runtime"
    assert network_references(page) == []
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page), "nothing is fetched"
    assert "@import" not in page and "url(" not in page


def run_draft_notebook(name: str, tmp_path, monkeypatch) -> dict:
    """Execute a notebook's code cells against a synthetic suite shaped like the demo suite.

    The loaders the notebook calls are replaced (the per-token tables, the spikes, problems,
    rollouts and answers tables, the tokenizer); parameters are the demo suite's own,
    results go to a temporary folder."""
    import types

    import jupytext

    from rlprobe_nb.suite import models, params, paths
    from rlprobe_nb.tables import lineage, storage, suite_tables

    P = params.load(None)
    data = synthetic.synthetic_suite(n_problems=3, rollouts_per_problem=2, n_tokens=40, seed=2,
                                     steps=dict(P.steps), suite=P.suite)
    monkeypatch.setattr(suite_tables, "read_tokens", lambda P, pairs=None, columns=None: data["tokens"])
    monkeypatch.setattr(lineage, "read_current", lambda P, table: (data[table], "sha-of-" + table))
    monkeypatch.setattr(lineage, "read_derived", lambda P, table: data[table])
    monkeypatch.setattr(storage, "read_table", lambda folder, *a, **k: data[paths.Path(folder).name])
    tokenizer = types.SimpleNamespace(decode=lambda ids: "".join(synthetic.decode(i) for i in ids))
    monkeypatch.setattr(models, "load_tokenizer", lambda name, P: tokenizer)
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    namespace = {"In": []}
    for cell in jupytext.read(paths.notebooks_dir() / f"{name}.py").cells:
        if cell.cell_type == "code":
            exec(compile(cell.source, f"{name}.py", "exec"), namespace)
    return namespace


def test_draft_notebook_06_on_synthetic_tables(tmp_path, monkeypatch):
    ns = run_draft_notebook("06_case_studies", tmp_path, monkeypatch)
    assert len(ns["cases"]) == len(ns["choices"]) >= 4
    assert not (tmp_path / "figures" / ns["P"].suite / "case_studies.html").exists(), \
        "one case-study page: the chapter's own"
    links = ns["viewer_links"].with_links(ns["choices"])._repr_html_()
    assert links.count('class="rp-open"') == len(ns["choices"])


def test_without_spikes_the_strongest_departures_stand_in_labelled_as_such(suite):
    tokens, no_spikes = suite["tokens"], suite["spikes"].iloc[0:0]
    rule = cs.CaseRule(n_categories=2, n_random=1, n_controls=1, seed=3)
    got = cs.select_cases(tokens, no_spikes, rule)
    stand_ins = got[got.kind == "departure"]
    assert len(stand_ins) == 3 and stand_ins.rollout_id.is_unique
    assert (got.kind == "control").sum() == 1 and not (got.kind == "spike").any()
    final = tokens[(tokens.checkpoint == FINAL) & (tokens.group == "target") & ~tokens.first_token
                   & ~tokens.is_eos]
    strength = final.kl_ref_ckpt + final.kl_ckpt_ref
    first = stand_ins.iloc[0]
    assert strength[(final.rollout_id == first.rollout_id) & (final.pos == first.pos)].iloc[0] == strength.max()
    cases = cs.build_cases(got, tokens, no_spikes, suite["problems"], suite["rollouts"], suite["answers"])
    page = case_page.case_studies_page(cases, shared_scale(tokens), synthetic.decode, no_spikes)
    assert page.count("strongest departures by symmetric KL") == 3
    assert "flags it as a spike" not in page

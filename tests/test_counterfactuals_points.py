"""Where chapter 08 branches and what it swaps in, on hand-built token tables (no model):
real alternatives, the correct digit from the ground-truth labeller, the point-selection
rule (format tokens excluded, spikes then ground-truth labels in order, seeded, spread
over problems) and the positive control's first wrong digits."""

from __future__ import annotations

import pandas as pd
import pytest
from counterfactual_tokens import EOS, Vocab, token_table, wrong_sums

from rlprobe_nb.counterfactuals import points


@pytest.fixture()
def table():
    vocab = Vocab()
    texts = wrong_sums(8, per_problem=2)
    tokens = token_table(texts, vocab)
    return points.annotate(tokens, texts, vocab.text_of, vocab.encode, {EOS}), vocab, texts


# --- real alternatives ----------------------------------------------------------------

@pytest.mark.parametrize("written, alt, real", [
    ("\n", "\n\n", False),  # a layout variant of the same (no) text
    (" the", "the", False), ("The", " the", False), (".", ".\n", False), ("4", " 4", False),
    (" ", " \\", True),  # the space where the checkpoint wants a backslash: it writes something
    ("4", "0", True), ("it", " the", True), (" apples", ".", True),
    ("x", "", False), ("x", " ", False),  # nothing written is no alternative
])
def test_a_real_alternative_writes_other_text(written, alt, real):
    assert points.is_real_alternative(written, alt) is real


def test_the_checkpoints_best_real_alternative_skips_variants_and_special_tokens():
    text = {1: "4", 2: " 4", 3: "\n", 4: "7", 5: "0", 9: "<eos>"}.get
    assert points.real_alternative([1, 2, 3, 4, 5], "4", text) == (4, 3)
    assert points.real_alternative([9, 2, 5], "4", text, exclude={9}) == (5, 2)
    assert points.real_alternative([1, 2, 3], "4", text) is None


# --- the correct digit ----------------------------------------------------------------

@pytest.mark.parametrize("text, wrong, digit, how", [
    ("We add: 50 + 59 = 149, so", "4", "0", "replace"),
    ("So 9 × 7 = 54.", "5", "6", "replace"),
    ("So 9 × 7 = 61.", "1", "3", "replace"),  # the second digit once the first is right
    ("$3 \\times 4 + 2 = 13 + 2$", "3", "2", "replace"),  # a piece of the right side: 12
    ("Then 100 + 5 = 10 apples.", " ", "5", "insert"),  # too short: the missing digit
])
def test_the_correct_digit_comes_from_the_labellers_statement(text, wrong, digit, how):
    (at,) = [s.first_wrong_char for s in points.ground_truth.statements(text)
             if s.first_wrong_char is not None]
    assert text[at] == wrong
    assert points.correct_character(text, at) == (digit, how)


@pytest.mark.parametrize("text", ["Then 100 + 5 = 1050 apples.",  # too long: no digit fixes it
                                  "Then 7 / 2 = 3 apples.",  # the truth goes on with "."
                                  "So 5 - 8 = 3 then"])  # a sign is missing
def test_no_correct_digit_where_no_single_digit_repairs_the_result(text):
    (at,) = [s.first_wrong_char for s in points.ground_truth.statements(text)
             if s.first_wrong_char is not None]
    digit, why = points.correct_character(text, at)
    assert digit is None and why


def test_no_correct_digit_off_a_first_wrong_character():
    assert points.correct_character("So 9 × 7 = 54.", 3)[0] is None


def test_the_correct_token_keeps_the_tokens_text_before_the_digit():
    vocab = Vocab()
    assert points.correct_token("149", 1, "0", vocab.encode) is None  # "10": two tokens here
    assert points.correct_token("4", 0, "0", vocab.encode) == vocab.id("0")
    assert points.correct_token(" apples", 0, "5", vocab.encode) == vocab.id("5")


def test_annotate_labels_formats_and_corrects(table):
    tok, vocab, texts = table
    fw = tok[tok.ground_truth == "result_first_wrong"]
    assert len(fw) == 16 and fw.correct_id.notna().all()
    for r in fw.itertuples():  # "<a> + <b> = <a+b+10>": the tens digit is wrong
        a, b = (int(x) for x in texts[r.rollout_id].split(" = ")[0].split()[-3::2])
        assert r.correct_char == str(a + b)[0] and r.correct_id == vocab.id(str(a + b)[0])
        assert texts[r.rollout_id][r.char_start] != r.correct_char
    fmt = tok[tok.format]
    assert set(fmt.token.str.strip()) <= {"", "\\boxed{", "}"}
    assert (tok.loc[tok.token == "\\boxed{", "ground_truth"] == "format").all()
    assert (tok.alt_rank.dropna() == 2).all()  # the whitespace variant at rank 1 is skipped
    assert tok.loc[tok.token.str.strip() == "", "alt_id"].isna().all()


# --- the selection rule ---------------------------------------------------------------

def spikes_at(tok, keys, significant=True, checkpoint="ck"):
    rows = tok.set_index(["rollout_id", "pos"]).loc[keys].reset_index()
    return rows.assign(checkpoint=checkpoint, significant=significant)[
        ["checkpoint", "group", "rollout_id", "pos", "significant"]]


NO_SPIKES = pd.DataFrame(columns=["checkpoint", "group", "rollout_id", "pos", "significant"])


def test_format_tokens_are_never_points_unless_asked(table):
    tok, _, _ = table
    boxes = tok[tok.token == "\\boxed{"][["rollout_id", "pos"]].head(3)
    spaces = tok[(tok.token == " ") & (tok.pos > 0)][["rollout_id", "pos"]].head(2)
    spikes = spikes_at(tok, [tuple(k) for k in pd.concat([boxes, spaces]).to_numpy()])
    labels = [x for x in points.ground_truth.LABELS if x != "format"]
    got = points.select_points(tok, spikes, checkpoint="ck", rule=["spikes"] + labels,
                               max_points=500)
    assert len(got) and not got.format.any() and "spikes" not in set(got.rule)
    assert not (got.ground_truth == "format").any() and (got.pos > 0).all() and not got.is_eos.any()
    assert not (got.category == "format").any() and (got.token.str.strip() != "").all()
    with pytest.raises(ValueError, match="include_format"):
        points.select_points(tok, spikes, checkpoint="ck", rule=["spikes", "format"])
    asked = points.select_points(tok, spikes, checkpoint="ck", rule=["spikes", "format"] + labels,
                                 max_points=500, include_format=True)
    assert set(zip(asked[asked.rule == "spikes"].rollout_id, asked[asked.rule == "spikes"].pos)) \
        == set(zip(boxes.rollout_id, boxes.pos))  # the spaces have no real alternative
    assert (asked.rule == "format").sum() == 2 * 16 - 3  # every other "\\boxed{" and "}"


def _ranks(tok, rule, spiked=frozenset()):
    """Each token's rank by ``rule`` (len(rule): no source claims it)."""
    out = []
    for r in tok.itertuples():
        hits = [i for i, s in enumerate(rule) if (s == "spikes" and (r.rollout_id, r.pos) in spiked)
                or s == r.ground_truth]
        out.append(min(hits) if hits else len(rule))
    return pd.Series(out, index=tok.index)


def test_spikes_first_then_ground_truth_labels_in_order(table):
    tok, _, _ = table
    words = tok[(tok.ground_truth == "other") & ~tok.format & (tok.pos > 0)]
    keys = [tuple(k) for k in words[["rollout_id", "pos"]].head(3).to_numpy()]  # in p0
    spikes = pd.concat([spikes_at(tok, keys),
                        spikes_at(tok, [tuple(words[["rollout_id", "pos"]].iloc[5])], False),
                        spikes_at(tok, [tuple(words[["rollout_id", "pos"]].iloc[6])],
                                  checkpoint="other")])
    rule = list(points.DEFAULT_RULE)
    got = points.select_points(tok, spikes, checkpoint="ck", rule=rule, max_points=24, seed=0)
    assert len(got) == 24 and got.problem_id.value_counts().eq(3).all()  # 3 a problem
    assert set(zip(got[got.rule == "spikes"].rollout_id, got[got.rule == "spikes"].pos)) == set(keys)
    assert (got.rule == "result_first_wrong").sum() == 14  # each other problem's two
    assert (got.rule == "result_after_wrong").sum() == 7  # then the next label
    # within a problem, no token left out ranks better than one taken
    ranks = _ranks(tok[points.eligible(tok)], rule, set(keys))
    eligible = tok[points.eligible(tok)].assign(rank=ranks)
    taken = set(zip(got.rollout_id, got.pos))
    for problem, part in eligible[eligible["rank"] < len(rule)].groupby("problem_id"):
        inside = [(r.rollout_id, r.pos) in taken for r in part.itertuples()]
        assert part["rank"][inside].max() <= part["rank"][[not i for i in inside]].min()
    few = points.select_points(tok, NO_SPIKES, checkpoint="ck", max_points=8, seed=0)
    assert set(few.rule) == {"result_first_wrong"} and few.problem_id.nunique() == 8
    ordered = points.select_points(tok, NO_SPIKES, checkpoint="ck", max_points=20,
                                   rule=["operator", "result_first_wrong"])
    assert set(ordered.rule) == {"operator"}  # the rule's order, not a fixed one
    with pytest.raises(ValueError, match="unknown point sources"):
        points.select_points(tok, NO_SPIKES, checkpoint="ck", rule=["spikez"])


def test_points_spread_over_problems_before_a_problem_gives_a_second(table):
    tok, _, _ = table
    p0 = tok.problem_id == "p0"  # only p0 keeps its first wrong digits (two of them) ...
    tok = tok.assign(ground_truth=tok.ground_truth.where(
        p0 | (tok.ground_truth != "result_first_wrong"), "operand"))
    got = points.select_points(tok, NO_SPIKES, checkpoint="ck", max_points=8,
                               rule=["result_first_wrong", "operand"])
    assert got.problem_id.nunique() == 8  # ... yet the 8 points come from 8 problems
    assert got[got.problem_id == "p0"].rule.tolist() == ["result_first_wrong"]
    assert (got[got.problem_id != "p0"].rule == "operand").all()
    more = points.select_points(tok, NO_SPIKES, checkpoint="ck", max_points=9,
                                rule=["result_first_wrong", "operand"])
    assert (more.rule == "result_first_wrong").sum() == 2  # round 2 starts with p0's next


def test_the_draw_is_seeded_and_spread_over_problems(table):
    tok, _, _ = table
    draw = [points.select_points(tok, NO_SPIKES, checkpoint="ck", max_points=8, seed=s)
            for s in (0, 0, 1, 2, 3)]
    pd.testing.assert_frame_equal(draw[0], draw[1])
    keys = [set(zip(d.rollout_id, d.pos)) for d in draw]
    assert any(k != keys[0] for k in keys[2:])  # another seed, another draw
    for d in draw:  # 8 points from 8 problems (each has 2 first wrong digits)
        assert d.problem_id.nunique() == 8 and (d.rule == "result_first_wrong").all()


def test_the_positive_control_takes_first_wrong_digits_with_a_correct_digit(table):
    tok, _, _ = table
    main = points.select_points(tok, NO_SPIKES, checkpoint="ck", max_points=3, seed=0)
    pos = points.select_positive(tok, main, 10, seed=0)
    assert len(pos) == 10 and (pos.ground_truth == "result_first_wrong").all()
    assert pos.correct_id.notna().all()
    main_keys = set(zip(main.rollout_id, main.pos))
    assert main_keys <= set(zip(pos.rollout_id, pos.pos))  # the points' own come first
    assert set(pos[pos.rule == "positive_control"].index) and \
        (pos[[k in main_keys for k in zip(pos.rollout_id, pos.pos)]].rule == "result_first_wrong").all()
    assert points.select_positive(tok, main, 0).empty


def test_the_positive_control_prefers_each_rollouts_first_error():
    vocab = Vocab()
    texts = {f"p{p}#0": f"So {11 + p} + 22 = {43 + p} and then 5 + 4 = 8, so \\boxed{{8}}"
             for p in range(4)}  # two wrong results per rollout: the sum first
    tok = points.annotate(token_table(texts, vocab), texts, vocab.text_of, vocab.encode, {EOS})
    fw = tok[tok.ground_truth == "result_first_wrong"]
    assert len(fw) == 8 and fw.correct_id.notna().all()
    none = tok.iloc[:0].assign(rule=[])
    first = points.select_positive(tok, none, 4, seed=3)
    assert sorted(first.token) == ["4"] * 4  # the sums' tens digits, one per rollout
    assert len(points.select_positive(tok, none, 6, seed=3)) == 6  # then the later errors


def test_the_positive_control_takes_both_kinds_of_wrong_statement_in_turn():
    """Three of twelve wrong statements compute the answer: the control reads each kind on
    its own, so six digits take three of each, not the pool's one in four."""
    vocab = Vocab()
    texts = {f"p{p:02d}#0": f"So {11 + p} + 22 = {43 + p}, so \\boxed{{{43 + p}}}" for p in range(12)}
    tok = points.annotate(token_table(texts, vocab), texts, vocab.text_of, vocab.encode, {EOS})
    fw = tok.ground_truth == "result_first_wrong"
    assert fw.sum() == 12 and tok[fw].correct_id.notna().all()
    answer = {"p00", "p04", "p08"}
    tok["result_is_answer"] = pd.Series(tok.problem_id.isin(answer) & fw, dtype=object).where(fw)
    none = tok.iloc[:0].assign(rule=[])
    for seed in range(4):
        chosen = points.select_positive(tok, none, 6, seed=seed)
        assert len(chosen) == 6 and chosen.problem_id.nunique() == 6
        assert set(chosen.problem_id) & answer == answer, seed
    assert len(points.select_positive(tok, none, 12, seed=0)) == 12


def test_unforced_rollouts_get_the_spans_the_labeller_needs(tiny):
    _, _, tok = tiny
    text = "First, 11 + 22 = 43 apples."
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    rollouts = pd.DataFrame({"rollout_id": ["p0#0"], "problem_id": ["p0"], "response_ids": [ids]})
    rows = points.rollout_tokens(rollouts, tok)
    assert len(rows) == len(ids) and rows.is_eos.tolist() == [False] * (len(ids) - 1) + [True]
    assert "".join(text[a:b] for a, b in zip(rows.char_start, rows.char_end)) == text
    rows["category"] = points.ground_truth.tc.classify(rows, {"p0#0": text}).astype(str)
    got = points.annotate(rows, {"p0#0": text}, lambda i: tok.decode([i]),
                          lambda s: tok.encode(s, add_special_tokens=False), {tok.eos_token_id})
    fw = got[got.ground_truth == "result_first_wrong"]
    assert len(fw) == 1 and text[fw.char_start.iloc[0]] == "4"
    assert got.alt_id.isna().all()  # no top-k: never a main point or a control
    # 11 + 22 = 33: the tens digit "4" becomes "3" (this tokenizer writes digits singly)
    assert fw.correct_char.iloc[0] == "3" and tok.decode([int(fw.correct_id.iloc[0])]) == "3"


def test_the_wrong_statements_value_says_whether_it_computes_the_answer(table):
    tok, _, texts = table
    fw = tok[tok.ground_truth == "result_first_wrong"]
    for r in fw.itertuples():  # "<a> + <b> = <wrong>": the true value is a + b
        a, b = (int(x) for x in texts[r.rollout_id].split(" = ")[0].split()[-3::2])
        assert r.statement_value == str(a + b)
    assert tok[tok.ground_truth != "result_first_wrong"].statement_value.isna().all()
    assert points.is_answer("33", " 33") is True and points.is_answer("33", "34") is False
    assert points.is_answer("7/2", "3.5") is True and points.is_answer("1200", "1,200") is True
    assert points.is_answer(None, "3") is None and points.is_answer("3", "x + 1") is None


def test_the_rollout_pool_adds_the_references_other_wrong_rollouts_only_on_request():
    rollouts = pd.DataFrame({
        "model": ["ref", "ref", "ref", "ref", "ck"],
        "rollout_id": ["p0#0", "p0#1", "p0#2", "p9#0", "p0#3"],
        "problem_id": ["p0", "p0", "p0", "p9", "p0"],
        "correct": [False, False, True, False, False]})
    forced = pd.DataFrame({"rollout_id": ["p0#0", "p0#0"], "problem_id": ["p0", "p0"]})
    both, others = points.rollout_pool(rollouts, "ref", forced, "problems")
    assert list(others.rollout_id) == ["p0#1"]  # wrong, same problem, the reference's
    assert sorted(both.rollout_id) == ["p0#0", "p0#1"]
    both, others = points.rollout_pool(rollouts, "ref", forced, "forced")
    assert others.empty and list(both.rollout_id) == ["p0#0"]

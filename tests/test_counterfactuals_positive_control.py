"""Positive control of takeover curves on the demo suite: a wrong result digit planted in a
right response must make the checkpoint's curve drop at that token (± 1), and the same
digit planted after the final box must leave the curve without a drop.

The slow test generates the checkpoint's greedy answers to 24 demo test problems, keeps
the first 10 right ones and locates the drop of each edited copy with n = 6 continuations
per point at T = 0.7 (about 550 continuations: ~7 minutes on an otherwise idle 2-core CPU;
17.5 minutes measured with the two cores shared with another test run).
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from rlprobe_nb.counterfactuals import edits, positive_control
from rlprobe_nb.generation import rollouts
from rlprobe_nb.problems import grading
from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.suite import models, params


@pytest.fixture(scope="module")
def tokenizer():
    P = params.load("demo")
    return models.load_tokenizer(P.reference, P)


def ids_of(tok, text):
    return tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]


def test_the_result_digit_is_the_first_statement_of_the_answer(tokenizer):
    ids = ids_of(tokenizer, "So, 28 + 33 = 61 books.\n\\boxed{61}")
    e = edits.result_edit(tokenizer, ids, "61")
    assert e.where == "result" and not e.in_box
    assert tokenizer.decode(ids[e.pos]) == "1" and tokenizer.decode(ids[e.pos - 1]) == "6"
    edited = tokenizer.decode(edits.apply(ids, e), skip_special_tokens=True)
    assert edited == "So, 28 + 33 = 62 books.\n\\boxed{61}"
    after = edits.after_answer_edit(tokenizer, ids, e)
    assert after.pos == len(ids) - 1 and after.new_id == e.new_id  # replaces the EOS
    assert tokenizer.decode(edits.apply(ids, after), skip_special_tokens=True).endswith("{61}2")


def test_a_one_line_answer_is_edited_in_its_box(tokenizer):
    ids = ids_of(tokenizer, "$45 + 99 = \\boxed{144}$")
    e = edits.result_edit(tokenizer, ids, "144")
    assert e.in_box and tokenizer.decode(edits.apply(ids, e), skip_special_tokens=True) == "$45 + 99 = \\boxed{145}$"
    after = edits.after_answer_edit(tokenizer, ids, e)
    # the first token after the one that closes the box ("}$" is one token here: EOS next)
    assert "}" in tokenizer.decode(ids[after.pos - 1]) and after.pos == len(ids) - 1


def test_no_edit_without_a_whole_number_answer_or_a_box(tokenizer):
    assert edits.result_edit(tokenizer, ids_of(tokenizer, "It is 1440."), "144") is None
    e = edits.result_edit(tokenizer, ids_of(tokenizer, "It is 144."), "144")
    assert edits.after_answer_edit(tokenizer, ids_of(tokenizer, "It is 144."), e) is None
    with pytest.raises(ValueError, match="expects"):
        edits.apply([1, 2, 3], edits.Edit(1, 9, 4, "result", False))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_planted_results_drop_where_planted_and_nowhere_else():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: two threads mostly wait on each other
    try:
        P = params.load("demo")
        lm = models.load_model("rlvr_step_1200", P)
        probs = problem_sources.load_problems("demo", n=24, seed=5, split_name="test")
        gold = dict(zip(probs.problem_id, probs.answer))
        answers = rollouts.generate_rollouts(
            lm.model, lm.tokenizer, probs, model_name="rlvr_step_1200", template=P.prompt_template,
            n_per_problem=1, temperatures=[0.0], max_new_tokens=96, seed=0, batch_size=24,
            progress=False)
        right = answers[answers.correct].head(10)
        assert len(right) == 10, "the checkpoint solves fewer demo problems than expected"
        out = positive_control.run(
            lm.model, lm.tokenizer, right, gold, model_name="rlvr_step_1200", n=6,
            temperature=0.7, max_new_tokens=96, seed=0, step=8,
            eos=set(rollouts.eos_ids(lm.model, lm.tokenizer)))
    finally:
        torch.set_num_threads(threads)
        grading.shutdown()
    with pd.option_context("display.width", 200):
        print(out.drop(columns=["curve"]).to_string())
    planted, after = out[out["where"] == "result"], out[out["where"] == "after_answer"]
    assert len(planted) == len(after) == 10
    assert planted["in_box"].sum() < 10  # some results are stated before the box
    assert planted["ok"].mean() >= 0.9, planted[["rollout_id", "edit_pos", "drop_token"]]
    assert after["ok"].mean() >= 0.9, after[["rollout_id", "drop_at"]]

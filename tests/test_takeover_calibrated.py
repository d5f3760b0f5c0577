"""Chapter 05's statistic as a takeover criterion (``takeover.calibrated``), on tiny random
Llama models: a reference, a checkpoint that moved far from it and a "placebo" that moved
a little. The decoder's score of each position equals the table path's (the same
statistic from a teacher-forced token table of the final text); it ranks the checkpoint's
departures above the placebo's own; a calibrated rule without its scorer is refused."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from rlprobe_nb.demo.tiny import tiny_llama, tiny_tokenizer
from rlprobe_nb.forcing import metrics
from rlprobe_nb.suite import prompting
from rlprobe_nb.takeover import calibrated
from rlprobe_nb.takeover.lockstep import ALWAYS, NEVER, Request, Rule, takeover_generate

PROBLEMS = ["What is 7 times 6?", "What is 12 + 30?", "Compute 3 + 4.", "What is 9 - 2?",
            "What is 5 + 5?", "Compute 8 - 3."]
MAX_NEW = 24


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: two threads only spin (see the lockstep tests)
    yield
    torch.set_num_threads(before)


def _table(ref, model, prompts, texts, name):
    """A token table of ``model`` vs ``ref`` over ``texts`` (teacher-forced), with the
    columns chapter 05's detector reads."""
    rows = []
    for r, (prompt, ids) in enumerate(zip(prompts, texts)):
        full = torch.tensor([list(prompt) + list(ids)])
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(ids))
        with torch.no_grad():
            q, p = ref(full).logits[0, span].float(), model(full).logits[0, span].float()
        m = metrics.token_metrics(p, q, torch.tensor(ids), topk=5)
        for pos, token in enumerate(ids):
            rows.append({"checkpoint": name, "problem_id": f"p{r % len(PROBLEMS)}",
                         "rollout_id": f"{name}-{r}", "pos": pos,
                         "context_id": f"{r}-{pos}", "token_id": int(token),
                         **{k: float(m[k][pos]) for k in (
                             "logp_ref", "logp_ckpt", "entropy_ref", "kl_ref_ckpt",
                             "kl_ckpt_ref")},
                         "topk_p_ref": m["topk_p_ref"][pos].numpy()})
    return pd.DataFrame(rows)


def forced_tables(ref, ckpt, placebo, prompts, eos):
    """The reference's own texts (three per prompt), forced through the placebo (the null's
    data) and the checkpoint: their token tables and the null fitted on the placebo's."""
    own = takeover_generate(ref, ref, [Request(p, 300 + i, (NEVER,)) for i, p in
                                       enumerate(prompts * 3)], eos, temperature=1.0,
                            max_new_tokens=MAX_NEW)
    texts = [w[0].ids for w in own]
    null_rows = _table(ref, placebo, prompts * 3, texts, "placebo")
    ckpt_rows = _table(ref, ckpt, prompts * 3, texts, "ckpt")
    return null_rows, ckpt_rows, calibrated.fit_null(null_rows)


@pytest.fixture(scope="module")
def world():
    tok = tiny_tokenizer()
    ref = tiny_llama(len(tok), seed=0)
    ckpt = tiny_llama(len(tok), seed=1, base=ref, perturb=0.02)
    placebo = tiny_llama(len(tok), seed=2, base=ref, perturb=0.005)
    prompts = [tuple(prompting.prompt_ids(tok, p)) for p in PROBLEMS]
    eos = [int(tok.eos_token_id)]
    null_rows, ckpt_rows, fitted = forced_tables(ref, ckpt, placebo, prompts, eos)
    return SimpleNamespace(tok=tok, ref=ref, ckpt=ckpt, prompts=prompts, eos=eos,
                           null_rows=null_rows, ckpt_rows=ckpt_rows, fitted=fitted,
                           scorer=calibrated.Scorer(fitted, 5))


def test_the_checkpoints_departures_score_above_the_placebos_own(world):
    """Not vacuous: a checkpoint that moved four times as far as the placebo gets larger
    statistics than the placebo at the same positions, and about the budget's share of
    the placebo's own positions passes the placebo's 90% quantile."""
    t_ckpt = calibrated.table_scores(world.ckpt_rows, world.fitted)
    t_null = calibrated.table_scores(world.null_rows, world.fitted)
    assert len(t_ckpt) == len(world.ckpt_rows) > 300 and np.isfinite(t_ckpt).all()
    assert np.median(t_ckpt) > np.quantile(t_null, 0.75)
    assert 0.05 <= np.mean(t_null > np.quantile(t_null, 0.9)) <= 0.11


def test_the_scorer_is_the_table_paths_statistic_on_the_same_logits(world):
    """The decoder's scorer (float64 from the log-softmaxes) and the table path (the
    token table's float32 columns of the same logits) compute one statistic: they differ
    by the columns' float32 rounding only (and its steps, below)."""
    prompt, ids = world.prompts[0], list(range(5, 25))
    full = torch.tensor([list(prompt) + ids])
    span = slice(len(prompt) - 1, len(prompt) - 1 + len(ids))
    with torch.no_grad():
        q = world.ref(full).logits[0, span].float()
        p = world.ckpt(full).logits[0, span].float()
    lq, lp = torch.log_softmax(q.double(), -1), torch.log_softmax(p.double(), -1)
    entropy = -(lq.exp() * lq).sum(-1)
    got = world.scorer(lq, lp, torch.tensor(ids), entropy).numpy()
    want = calibrated.table_scores(_table(world.ref, world.ckpt, [prompt], [ids], "ckpt"),
                                   world.fitted)
    assert got.shape == want.shape == (len(ids),) and np.isfinite(got).all()
    rel = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    # the null's scale reads covariates by their rank among its fitted values (a step):
    # where a covariate's float32 rounding crosses one, the score steps (measured: one
    # position of these 20 by 3.5e-3); everywhere else it is float32 rounding
    assert np.mean(rel < 1e-5) >= 0.9 and rel.max() < 1e-2, rel


def test_decoder_scores_equal_the_table_paths(world):
    """At every position of every text a calibrated rule wrote, the score the decoder
    recorded (its one-token steps' logits) equals the statistic of the teacher-forced
    token table of that text at that position (one forward of the whole text), up to
    rounding: the raw metrics of the two ways differ by float32 rounding (the lockstep
    tests bound it by BATCH_TOLERANCE, ~3e-4), the standardisation divides log D and the
    log-odds change by the null's scale, which amplifies it, and the scale steps where a
    covariate crosses a fitted value (measured on 414 positions: 9.6e-3 at worst, 1.3e-6
    in the median)."""
    t_ckpt = calibrated.table_scores(world.ckpt_rows, world.fitted)
    rules = (NEVER, ALWAYS) + tuple(Rule("calibrated", float(np.quantile(t_ckpt, q)))
                                    for q in (0.5, 0.9))
    decisions = {}

    def record(nodes, x_ref, x_ckpt, scores):
        for b, node in enumerate(nodes):
            decisions[(node.request, tuple(node.ids))] = (int(x_ref[b]),
                                                         float(scores["calibrated"][b]))

    written = takeover_generate(world.ref, world.ckpt,
                                [Request(p, 50 + i, rules) for i, p in enumerate(world.prompts)],
                                world.eos, temperature=1.0, max_new_tokens=MAX_NEW,
                                record=record, calibrated=world.scorer)
    assert any(w[2].taken for w in written) and any(w[2].ids != w[0].ids for w in written)
    worst, compared, errors = 0.0, 0, []
    for i, per in enumerate(written):
        for w in {tuple(x.ids) for x in per}:
            table = _table(world.ref, world.ckpt, [world.prompts[i]], [w], "ckpt")
            want = calibrated.table_scores(table, world.fitted)
            for pos in range(len(w)):
                x_ref, got = decisions[(i, w[:pos])]
                if w[pos] != x_ref:
                    continue  # the table scores the written token; the decoder the draw
                err = abs(got - want[pos]) / max(1.0, abs(want[pos]))
                worst, compared = max(worst, err), compared + 1
                errors.append(err)
    assert compared > 100
    assert worst < 2e-2 and np.median(errors) < 1e-3, (worst, np.median(errors))
    print(f"calibrated: {compared} positions, worst relative difference {worst:.1e}, "
          f"median {np.median(errors):.1e}")


def test_a_calibrated_rule_needs_its_scorer(world):
    with pytest.raises(ValueError, match="calibrated rule but no scorer"):
        takeover_generate(world.ref, world.ckpt, [Request(world.prompts[0], 1,
                                                          (Rule("calibrated", 1.0),))],
                          world.eos, temperature=1.0, max_new_tokens=4)

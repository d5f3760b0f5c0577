"""forcing.shared_prompts: a batch whose rollouts share prompts forwards each prompt once;
its hidden states are the whole-sequence forward's up to float rounding (against a
float64 forward of the whole sequences, too), in the rows' order, on a random model and
on the demo suite's reference."""

import pytest
import torch

from rlprobe_nb.forcing import batching, body, sequences, shared_prompts
from rlprobe_nb.suite import models, params, prompting
from tiny_models import tiny_llama

PROBLEMS = ["What is $2+3$?", "What is $12 \\times 4$?", "Ravi had 65 cookies and gave away 11."]


def rollouts(tok, per_problem=(3, 1, 2)):
    """Forced sequences: several rollouts of some prompts, one of another, and a rollout
    whose response is a single token (its only row comes from the prompt's last position)."""
    out = []
    for i, (problem, n) in enumerate(zip(PROBLEMS, per_problem)):
        prompt = prompting.prompt_ids(tok, problem)
        for r in range(n):
            text = f"We add {i} and {r}: {i + r}." * (r + 1)
            response = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
            out.append(sequences.make_sequence(f"p{i}#{r}", f"p{i}", prompt, response))
    out.append(sequences.make_sequence("p0#eos", "p0", prompting.prompt_ids(tok, PROBLEMS[0]),
                                       [tok.eos_token_id]))
    return out


def whole(model, members):
    b = batching.plan_batches(members, 10 ** 6)[0]
    ordered = [members[i] for i in b.members]
    ids, mask, rows, _ = batching.batch_inputs(ordered, b.width, "cpu")
    return ordered, body.forward_hidden(model, ids, mask, rows)


@pytest.fixture(scope="module")
def tiny():
    model, tok = tiny_llama()
    return model, tok


def test_prompts_are_found_and_batches_keep_a_prompts_rollouts_together(tiny):
    _, tok = tiny
    seqs = rollouts(tok)
    prompts, which = shared_prompts.prompt_groups(seqs)
    assert len(prompts) == 3 and which == [0, 0, 0, 1, 2, 2, 0]
    assert shared_prompts.shares_prompts(seqs) and not shared_prompts.shares_prompts(seqs[3:5])
    for budget in (10 ** 6, 400, 150):
        for b in batching.plan_batches(seqs, budget):
            problems = [seqs[i].problem_id for i in b.members]
            # a prompt's rollouts are contiguous in the planned order
            assert problems == sorted(problems, key=problems.index)


def test_shared_forward_equals_the_whole_sequences_forward(tiny):
    model, tok = tiny
    ordered, want = whole(model, rollouts(tok))
    got = shared_prompts.forward_shared(model, ordered, "cpu")
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
    # and both against float64 whole sequences, one at a time (no padding at all)
    ref = model.double()
    try:
        exact = torch.cat([body.forward_hidden(ref, torch.tensor([s.input_ids[:-1]]), None,
                                               torch.tensor(list(s.row_positions())))
                           for s in ordered])
    finally:
        model.float()
    assert (got.double() - exact).abs().max() < 1e-4


def test_shared_forward_on_the_demo_reference():
    P = params.load("demo", overrides={"runtime.device": "cpu"})
    lm = models.load_model(P.reference, P)
    ordered, want = whole(lm.model, rollouts(lm.tokenizer))
    got = shared_prompts.forward_shared(lm.model, ordered, "cpu")
    scale = want.abs().max()
    assert (got - want).abs().max() <= 2e-5 * scale, ((got - want).abs().max(), scale)

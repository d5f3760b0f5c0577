"""Seeded continuations: the same tokens whatever the batch size and in fresh processes,
the same draws for every model that continues a context; budgets, EOS and boxes handled
per row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlprobe_nb.counterfactuals import continuations as C
from rlprobe_nb.suite import prompting

REPO = Path(__file__).resolve().parents[1]
PROBLEMS = ["What is $2+3$?", "What is $12 \\times 4$?", "Solve $3x = 14$ for $x$."]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine two threads wait on each other far
    longer than the tiny model computes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)



def contexts_and_seeds(tok, n=4, limit=24, base=7):
    """Contexts of three prompts and fake responses cut at several k, one substituted."""
    out, seeds = [], []
    for i, problem in enumerate(PROBLEMS):
        prompt = tuple(prompting.prompt_ids(tok, problem))
        response = tok.encode(f"We add {i} and {i + 3} to get {2 * i + 3}.", add_special_tokens=False)
        for k, sub in ((0, None), (3, None), (5, None), (5, response[1])):
            out.append(C.Context(prompt, C.branch_response(response, k, sub), limit))
            seeds.append([C.continuation_seed(base, f"r{i}", k, sub, s) for s in range(n)])
    return out, seeds


SCRIPT = """
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
sys.path.insert(0, sys.argv[2])
from test_counterfactuals_continuations import contexts_and_seeds
from rlprobe_nb.counterfactuals import continuations as C
torch.set_num_threads(1)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ctx, seeds = contexts_and_seeds(tok)
print(json.dumps(C.continue_contexts(model, tok, ctx, seeds, 1.0, batch_rows=8)))
"""


def test_batch_size_does_not_change_continuations(tiny):
    _, model, tok = tiny
    ctx, seeds = contexts_and_seeds(tok)
    one = C.continue_contexts(model, tok, ctx, seeds, 1.0, batch_rows=1)
    for rows in (8, 5, 64):
        assert C.continue_contexts(model, tok, ctx, seeds, 1.0, batch_rows=rows) == one, rows
    flat = [ids for per in one for ids, _ in per]
    assert len(set(map(tuple, flat))) > len(flat) // 2  # samples differ: the seeds matter


def test_fresh_processes_give_the_same_continuations(tiny):
    folder, model, tok = tiny
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(REPO / "tests")],
                             capture_output=True, text=True, cwd=REPO, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    ctx, seeds = contexts_and_seeds(tok)
    here = C.continue_contexts(model, tok, ctx, seeds, 1.0, batch_rows=1)
    assert runs[0] == runs[1] == json.loads(json.dumps(here))


def test_a_seed_belongs_to_its_context_not_to_the_model():
    base = C.continuation_seed(0, "r", 3, None, 0)
    assert base == C.continuation_seed(0, "r", 3, None, 0)
    others = {C.continuation_seed(0, "r", 3, None, 1), C.continuation_seed(0, "r", 4, None, 0),
              C.continuation_seed(0, "r", 3, 11, 0), C.continuation_seed(0, "q", 3, None, 0),
              C.continuation_seed(1, "r", 3, None, 0)}
    assert base not in others and len(others) == 5


def test_budgets_stop_each_row_and_eos_is_kept(tiny):
    _, model, tok = tiny
    ctx, seeds = contexts_and_seeds(tok, n=3, limit=12)
    out = C.continue_contexts(model, tok, ctx, seeds, 1.0, batch_rows=6)
    for c, per in zip(ctx, out):
        for ids, reason in per:
            assert len(c.response_ids) + len(ids) <= 12
            if reason == "stop":
                assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]
            else:
                assert len(c.response_ids) + len(ids) == 12 and tok.eos_token_id not in ids
    full = C.Context(ctx[0].prompt_ids, tuple(range(100, 112)), 12)  # no budget left
    assert C.continue_contexts(model, tok, [full], [[1, 2]], 1.0) == [[([], "length")] * 2]


def test_greedy_continuation_equals_the_models_argmax(tiny):
    _, model, tok = tiny
    ctx, _ = contexts_and_seeds(tok)
    c = ctx[1]
    (ids, _), = C.continue_contexts(model, tok, [c], [[0]], 0.0)[0]
    seq = list(c.prompt_ids + c.response_ids)
    with torch.no_grad():
        for t in ids:
            assert t == int(model(torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(t)


def test_branch_response_and_bad_arguments():
    assert C.branch_response([5, 6, 7], 2, None) == (5, 6)
    assert C.branch_response([5, 6, 7], 2, 9) == (5, 6, 9)
    with pytest.raises(ValueError, match="outside the response"):
        C.branch_response([5, 6, 7], 4, None)
    with pytest.raises(ValueError, match="same number of seeds"):
        C.continue_contexts(None, None, [C.Context((1,), (), 4)] * 2, [[1], [1, 2]], 1.0)


def test_a_continuation_cap_limits_each_row_below_the_response_limit(tiny):
    _, model, tok = tiny
    ctx, seeds = contexts_and_seeds(tok, n=2, limit=40)
    capped = [C.Context(c.prompt_ids, c.response_ids, c.max_new_tokens, 5) for c in ctx]
    assert all(c.budget == 5 for c in capped)
    assert C.Context((1,), (2,) * 38, 40, 5).budget == 2  # the response limit still holds
    out = C.continue_contexts(model, tok, capped, seeds, 1.0, batch_rows=8)
    for per in out:
        for ids, reason in per:
            assert len(ids) <= 5 and (reason == "stop" or len(ids) == 5)


def test_a_row_stops_once_its_own_text_closes_a_box(tiny):
    _, _, tok = tiny
    watch = C.BoxWatch(tok)
    new = tok.encode(" so \\boxed{12} and more", add_special_tokens=False)
    closed = [j for j in range(1, len(new) + 1) if watch.closed(new[:j])]
    assert closed and tok.decode(new[:closed[0]]).rstrip().endswith("}")
    assert "}" not in tok.decode(new[:closed[0] - 1])
    assert not any(watch.closed(new[:j]) for j in range(closed[0]))
    other = tok.encode(" no box {at} all", add_special_tokens=False)  # braces, no box
    assert not any(watch.closed(other[:j]) for j in range(len(other) + 1))


def test_box_stops_cut_each_row_after_its_box(tiny, monkeypatch):
    """Rows that close a box end there ("box"), the others run on; the box is the
    continuation's own: the context's box stops nothing."""
    _, model, tok = tiny
    for base in range(7, 17):  # the first seeds under which the random model writes a "}"
        ctx, seeds = contexts_and_seeds(tok, n=4, limit=30, base=base)
        plain = C.continue_contexts(model, tok, ctx, seeds, 1.0, batch_rows=8)
        closing = {t for per in plain for ids, _ in per for t in ids if "}" in tok.decode([t])}
        if closing:
            break
    assert closing, "the tiny model writes no closing brace under ten seeds"
    monkeypatch.setattr(C.grading, "extract_boxed", lambda text: ["x"] if "}" in text else [])
    boxed = C.continue_contexts(model, tok, ctx, seeds, 1.0, batch_rows=8, stop_at_box=True)
    stopped = 0
    for per_plain, per_boxed in zip(plain, boxed):
        for (ids, reason), got in zip(per_plain, per_boxed):
            first = next((j for j, t in enumerate(ids) if t in closing), None)
            assert got == ((ids, reason) if first is None else (ids[:first + 1], "box"))
            stopped += first is not None
    assert stopped  # some rows did stop at their box

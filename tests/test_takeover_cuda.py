"""Takeover decoding (chapter 09) on a GPU: the lock-step decoder and the calibrated
criterion on CUDA write what they write on the CPU. Skipped without CUDA (run it on a
GPU machine: ``python -m pytest tests/test_takeover_cuda.py``, or
``scripts/device_book.sh cuda_tests``, which runs every CUDA-only test).

The same tiny float32 models and requests run on both devices. The two devices' matrix
products round differently, so a draw that falls within rounding of a boundary between
two tokens may differ; with these models (two draws differ at about a third of the
positions, scores spread over nats) that is rare, and the tests bound it: at least 90% of
the texts equal token for token, and the scores recorded at the positions both devices
decided agree to float32 rounding (the calibrated statistic to its scale's steps, as on
the CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlprobe_nb.demo.tiny import tiny_llama, tiny_tokenizer
from rlprobe_nb.generation import decoding
from rlprobe_nb.suite import prompting
from rlprobe_nb.takeover import calibrated
from rlprobe_nb.takeover.lockstep import ALWAYS, NEVER, Request, Rule, takeover_generate

from tests.test_takeover_calibrated import MAX_NEW, PROBLEMS, forced_tables

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _models(device):
    tok = tiny_tokenizer()
    ref = tiny_llama(len(tok), seed=0)
    ckpt = tiny_llama(len(tok), seed=1, base=ref, perturb=0.02)
    placebo = tiny_llama(len(tok), seed=2, base=ref, perturb=0.005)
    return tok, [m.to(device) for m in (ref, ckpt, placebo)]


@pytest.fixture(scope="module")
def world():
    """The calibrated null fitted on the CPU (as the book fits it: from token tables), the
    same rules run on both devices, every decision recorded."""
    tok, (ref, ckpt, placebo) = _models("cpu")
    prompts = [tuple(prompting.prompt_ids(tok, p)) for p in PROBLEMS]
    eos = [int(tok.eos_token_id)]
    _, ckpt_rows, fitted = forced_tables(ref, ckpt, placebo, prompts, eos)
    t_ckpt = calibrated.table_scores(ckpt_rows, fitted)
    rules = (NEVER, ALWAYS, Rule("delta_logp", 0.5), Rule("kl", 0.2), Rule("entropy", 3.5),
             Rule("random", 0.7)) + tuple(Rule("calibrated", float(np.quantile(t_ckpt, q)))
                                          for q in (0.5, 0.9))
    requests = [Request(p, 50 + i, rules) for i, p in enumerate(prompts * 2)]
    runs = {}
    for device in ("cpu", "cuda"):
        _, (r, c, _) = _models(device)
        decisions = {}

        def record(nodes, x_ref, x_ckpt, scores, decisions=decisions):
            for b, node in enumerate(nodes):
                decisions[(node.request, tuple(node.ids))] = {
                    k: float(v[b]) for k, v in scores.items()}

        written = takeover_generate(r, c, requests, eos, temperature=1.0,
                                    max_new_tokens=MAX_NEW, record=record,
                                    calibrated=calibrated.Scorer(fitted, 5))
        alone = {name: decoding.generate(m, [decoding.Request(q.prompt, 1.0, q.seed, MAX_NEW)
                                             for q in requests], eos, cuda_graphs=False)
                 for name, m in (("ref", r), ("ckpt", c))}
        runs[device] = SimpleNamespace(written=written, decisions=decisions, alone=alone)
    return SimpleNamespace(rules=rules, requests=requests, **runs)


def test_texts_on_cuda_are_the_cpus(world):
    pairs = [(a.ids, b.ids) for per_cpu, per_gpu in zip(world.cpu.written, world.cuda.written)
             for a, b in zip(per_cpu, per_gpu)]
    same = np.mean([a == b for a, b in pairs])
    assert len(pairs) == len(world.requests) * len(world.rules)
    assert same >= 0.9, same
    # not vacuous: the rules wrote different texts (takeovers changed tokens)
    assert len({tuple(a) for a, _ in pairs}) > 2 * len(world.requests)


def test_the_ends_on_cuda_are_each_model_alone(world):
    """NEVER writes the reference's own text and ALWAYS the checkpoint's, on the GPU too
    (the book's generator, eager like the lock-step decoder)."""
    never, always = world.rules.index(NEVER), world.rules.index(ALWAYS)
    for i, per in enumerate(world.cuda.written):
        assert (per[never].ids, per[never].finish) == tuple(world.cuda.alone["ref"][i])
        assert (per[always].ids, per[always].finish) == tuple(world.cuda.alone["ckpt"][i])


def test_scores_on_cuda_are_the_cpus(world):
    """Every criterion's score at every prefix both devices decided, calibrated included
    (computed from CUDA logits by a null fitted on the CPU)."""
    shared = world.cpu.decisions.keys() & world.cuda.decisions.keys()
    assert len(shared) > 200
    worst = {}
    for key in shared:
        for name, got in world.cuda.decisions[key].items():
            want = world.cpu.decisions[key][name]
            err = abs(got - want) / max(1.0, abs(want))
            worst[name] = max(worst.get(name, 0.0), err)
    assert {"delta_logp", "kl", "entropy", "calibrated"} <= worst.keys()
    for name in ("delta_logp", "kl", "entropy"):
        assert worst[name] < 1e-3, (name, worst[name])
    assert worst["calibrated"] < 2e-2, worst["calibrated"]  # the scale's steps (see the CPU test)
    if "random" in worst:
        assert worst["random"] == 0.0  # the coin is a function of seed and position

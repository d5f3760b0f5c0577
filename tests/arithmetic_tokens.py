"""Hand-built per-token tables over responses that write arithmetic, with a planted change
per ground-truth label: the checkpoint moves the written token's logit by a chosen amount
for the tokens of chosen labels from a chosen step on, and leaves every other position
exactly as the reference has it. Every metric is computed exactly (``pair_metrics``), so
chapter 04's tables can be checked against what was planted."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from synthetic_tokens import _log_softmax, pair_metrics

from rlprobe_nb.divergence import ground_truth

_TOKEN = re.compile(r"\d|[A-Za-z]+|[ \t]+|\n|\\[a-z]+\{?|.")


def response(i: int, wrong: bool = True, boxed: bool = True) -> str:
    """A two-step solution; the second result is off by one when ``wrong``."""
    a, b, k = 21 + 3 * i, 14 + 5 * i, 2 + i % 3
    first = a + b
    second = first * k + (1 if wrong else 0)
    text = f"Step 1: {a} + {b} = {first}\nStep 2: {first} * {k} = {second}\n"
    return text + (f"So the answer is $\\boxed{{{second}}}$." if boxed else "So that is it.")


def tokens_of(text: str) -> list[tuple[str, int, int]]:
    return [(m.group(0), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def arithmetic_tokens(n_problems: int = 8, steps=(100, 200, 400, 800),
                      plant: dict | None = None, vocab: int = 6, seed: int = 0,
                      texts: dict | None = None, group: str = "target",
                      temperature: float = 1.0) -> tuple[pd.DataFrame, dict]:
    """(token rows of checkpoints ``rlvr_step_N`` against ``dpo``, rollout_id -> text).

    ``plant`` maps a ground-truth label to (first step, shift in nats): from that step on,
    the checkpoint adds shift x (1 + 0.3 z_problem) + 0.2 noise to the written token's
    logit at that label's tokens; every other position is exactly the reference.
    ``texts`` (problem index -> response text) replaces the default responses."""
    plant = plant or {}
    rng = np.random.default_rng(seed)
    frames, all_texts = [], {}
    for pi in range(n_problems):
        problem, rollout = f"p{pi:02d}", f"p{pi:02d}#0"
        text = (texts or {}).get(pi, response(pi))
        all_texts[rollout] = text
        pieces = tokens_of(text)
        n = len(pieces)
        base = pd.DataFrame({"rollout_id": rollout, "pos": np.arange(n),
                             "token": [p[0] for p in pieces],
                             "char_start": [p[1] for p in pieces],
                             "char_end": [p[2] for p in pieces], "is_eos": False})
        labels = ground_truth.label(base, {rollout: text}).astype(str).to_numpy()
        z_ref = rng.normal(0, 1.5, size=(n, vocab))
        token = np.zeros(n, dtype=int)  # the written token is id 0 everywhere
        z_ref[:, 0] += 1.0
        effect, noise = rng.normal(), rng.normal(0, 0.2, size=n)
        lq = _log_softmax(z_ref)
        for step in steps:
            z = z_ref.copy()
            for label, (start, shift) in plant.items():
                hit = (labels == label) & (step >= start)
                z[hit, 0] += shift * (1 + 0.3 * effect) + noise[hit]
            cols = pair_metrics(_log_softmax(z), lq, token, topk=vocab)
            frames.append(base.assign(
                suite="arithmetic", checkpoint=f"rlvr_step_{step}", reference="dpo",
                problem_id=problem, token_id=token, **cols, step=step, group=group,
                failure_type="boxed_wrong", temperature=np.float32(temperature),
                first_token=np.arange(n) == 0, context_id=np.arange(n), shared_context=False,
                dlogp=cols["logp_ckpt"] - cols["logp_ref"]))
    return pd.concat(frames, ignore_index=True), all_texts

"""From completions to learning signal: the verifiable reward (a correct plain-number
answer, plus a small bonus for one box and a finished response) and GRPO's
group-normalized advantages."""

from __future__ import annotations

import numpy as np

from rlprobe_nb.problems import arithmetic


def is_correct(grade, answer_must_be_number: bool = True) -> bool:
    """The demo's verdict: math-verify's, and (by default) the answer is a plain number."""
    return bool(grade.correct) and (not answer_must_be_number
                                    or arithmetic.is_plain_number(grade.extracted))


def rewards(tokenizer, completions, stopped, golds, format_weight: float, workers: int,
            answer_must_be_number: bool = True):
    from rlprobe_nb.problems import grading

    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    grades = grading.grade_many(texts, golds, timeout_s=5.0, workers=workers)
    correct = np.array([is_correct(g, answer_must_be_number) for g in grades],
                       dtype=np.float64)
    well_formed = np.array([g.n_boxes == 1 and bool(g.extracted) and s
                            for g, s in zip(grades, stopped)], dtype=np.float64)
    return correct + format_weight * well_formed, correct, well_formed, texts


def group_advantages(r: np.ndarray, group_size: int) -> np.ndarray:
    g = r.reshape(-1, group_size)
    return ((g - g.mean(axis=1, keepdims=True)) / (g.std(axis=1, keepdims=True) + 1e-4)).ravel()


def permuted_rewards(r: np.ndarray, seed: int, rnd: int) -> np.ndarray:
    """The placebo reward: the round's rewards in a seeded random order. The mean and the
    spread are those of the real reward; which completion gets which is chance, so the
    reward says nothing about correctness (a function of seed and round alone, so a
    resumed run draws the same)."""
    return r[np.random.default_rng([seed, rnd, 0x9A]).permutation(len(r))]

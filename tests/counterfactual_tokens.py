"""Hand-built per-token tables for chapter 08's tests: texts cut into tokens by a small
rule (each digit its own token, words with their leading space, whitespace runs,
``\\boxed{``, single symbols), a vocabulary built on the fly, and a checkpoint top-k at
every token of [the written token, a whitespace variant of it, a real alternative], so
the real alternative is always at rank 2. No model weights are involved."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from rlprobe_nb.divergence import token_categories

PIECE = re.compile(r"\\boxed\{|\d| ?[A-Za-z]+|\s+|[^\sA-Za-z\d]")
EOS = 0


class Vocab:
    def __init__(self):
        self.ids: dict[str, int] = {"<eos>": EOS}

    def id(self, text: str) -> int:
        return self.ids.setdefault(text, len(self.ids))

    def text_of(self, i: int) -> str:
        return next(t for t, j in self.ids.items() if j == i)

    def encode(self, text: str) -> list[int]:
        return [self.id(p) for p in PIECE.findall(text)]


def alternative(piece: str) -> str:
    if piece.isdigit():
        return str((int(piece) + 1) % 10)
    return "\n\n" if not piece.strip() else " other"


def token_table(texts: dict[str, str], vocab: Vocab, seed: int = 0) -> pd.DataFrame:
    """Rows of a per-token table for ``texts`` (rollout_id ``<problem>#<k>`` -> text),
    EOS last, with the columns chapter 08 reads and chapter 04's category."""
    rng = np.random.default_rng(seed)
    rows = []
    for rid, text in texts.items():
        pieces, at = PIECE.findall(text), 0
        assert "".join(pieces) == text, text
        for pos, piece in enumerate(pieces + [""]):
            eos = pos == len(pieces)
            written = EOS if eos else vocab.id(piece)
            top = [written, vocab.id(piece + "\n"), vocab.id(alternative(piece))]
            rows.append({"checkpoint": "ck", "group": "target", "rollout_id": rid,
                         "problem_id": rid.split("#")[0], "pos": pos, "token_id": written,
                         "token": piece, "char_start": at, "char_end": at + len(piece),
                         "first_token": pos == 0, "is_eos": eos,
                         "entropy_ref": float(rng.uniform(0, 2)), "topk_ids_ckpt": top})
            at += len(piece)
    df = pd.DataFrame(rows)
    df["category"] = token_categories.classify(df, texts).astype(str)
    return df


def wrong_sums(n_problems: int, per_problem: int = 1) -> dict[str, str]:
    """Texts with one wrong sum each (its first wrong digit is the result's second), a
    right product, and a box."""
    texts = {}
    for p in range(n_problems):
        for k in range(per_problem):
            a, b = 11 + p, 22 + k
            wrong = a + b + 10  # the tens digit is wrong
            texts[f"p{p}#{k}"] = (f"First, {a} + {b} = {wrong} apples.\n"
                                  f"Then 2 * 3 = 6 so \\boxed{{{wrong}}}")
    return texts

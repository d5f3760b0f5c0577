"""Forced sequences: prompt ids (chat template with the generation prompt, one BOS) + the
rollout's own generated ids (EOS included when the model stopped). Row k of a token table
predicts response token k from position prompt_len + k - 1, so the first response token
and EOS have rows; the last input position predicts nothing and is not fed.

``build_sequences`` refuses, before any forward: duplicate or unknown rollout ids,
problems missing from the problems table, a prompt that differs from the one the rollout
was sampled from, stored ids that differ from the text's tokenization, an empty response,
and (policy "error") a sequence longer than the model's context; policy "skip" skips and
counts those.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from rlprobe_nb.forcing.spans import token_spans
from rlprobe_nb.progress import tqdm
from rlprobe_nb.suite import prompting, tokenizers
from rlprobe_nb.tables import storage

TOKEN_METHODS = ("generated", "text")
LABELS = ("group", "failure_type", "temperature", "finish_reason")
CONTEXT_POLICIES = ("skip", "error")


@dataclass
class ForcedSequence:
    """One rollout as forced input. Row k of its table predicts ``response_ids[k]``."""

    rollout_id: str
    problem_id: str
    input_ids: list[int]  # prompt ids + response ids
    prompt_len: int
    response_ids: list[int]
    token_method: str  # "generated" | "text"
    tokens: list[str] = field(default_factory=list)  # text of each response token
    char_start: list[int] = field(default_factory=list)  # span in response_text
    char_end: list[int] = field(default_factory=list)
    response_text: str = ""
    # what the rollout is, carried into every row of the token table: group (target or a
    # contrast), failure_type, temperature, finish_reason (see schemas.TOKENS)
    labels: dict = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        return len(self.response_ids)

    def row_positions(self) -> range:
        """Input positions whose logits predict the response tokens."""
        return range(self.prompt_len - 1, self.prompt_len + len(self.response_ids) - 1)

    def content_hash(self) -> str:
        blob = json.dumps([self.rollout_id, self.prompt_len, self.input_ids])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def context_ids(self) -> np.ndarray:
        """Per row, a 64-bit hash of the context its prediction depends on (the prompt and
        the response tokens before it): equal ids mean identical predictions."""
        h = hashlib.blake2b(np.asarray(self.input_ids[:self.prompt_len], np.int64).tobytes(),
                            digest_size=8)
        out = np.empty(self.n_rows, dtype=np.int64)
        for k, token in enumerate(self.response_ids):
            out[k] = int.from_bytes(h.digest(), "little", signed=True)
            h.update(int(token).to_bytes(8, "little", signed=True))
        return out


def make_sequence(rollout_id: str, problem_id: str, prompt_ids: Sequence[int],
                  response_ids: Sequence[int], token_method: str = "generated",
                  tokenizer=None) -> ForcedSequence:
    """A ForcedSequence from ids; with a tokenizer, also token texts and character spans."""
    if token_method not in TOKEN_METHODS:
        raise ValueError(f"token_method must be one of {TOKEN_METHODS}, got {token_method!r}")
    prompt_ids, response_ids = [int(i) for i in prompt_ids], [int(i) for i in response_ids]
    if not prompt_ids:
        raise ValueError(f"rollout {rollout_id!r}: empty prompt")
    if not response_ids:
        raise ValueError(f"rollout {rollout_id!r}: empty response; there is nothing to "
                         "force (drop it from the rollouts or regenerate it)")
    seq = ForcedSequence(rollout_id, problem_id, prompt_ids + response_ids, len(prompt_ids),
                         response_ids, token_method)
    if tokenizer is not None:
        seq.tokens, seq.char_start, seq.char_end, seq.response_text = token_spans(
            tokenizer, response_ids)
    else:
        seq.tokens = [""] * len(response_ids)
        seq.char_start = [0] * len(response_ids)
        seq.char_end = [0] * len(response_ids)
    return seq


@dataclass
class SequenceSet:
    """The forced sequences of one run, plus what was skipped and why."""

    sequences: list[ForcedSequence]
    skipped: list[dict] = field(default_factory=list)
    tokenizer: dict = field(default_factory=dict)  # tokenizer_identity of the tokenizer used
    max_context: int | None = None
    context_policy: str = "skip"

    def __len__(self) -> int:
        return len(self.sequences)

    def fingerprint(self) -> str:
        return storage.fingerprint([[s.rollout_id, s.content_hash(), s.labels]
                                    for s in self.sequences]
                                   + [self.tokenizer.get("vocab_sha256")])

    def shared_contexts(self) -> set[int]:
        """Context ids that occur in more than one sequence of the set (the first tokens of
        rollouts of one problem, and any longer common prefix)."""
        if not hasattr(self, "_shared"):
            counts = Counter()
            for s in self.sequences:
                counts.update(set(s.context_ids().tolist()))
            self._shared = {c for c, n in counts.items() if n > 1}
        return self._shared

    def n_rows(self) -> int:
        return sum(s.n_rows for s in self.sequences)

    def facts(self) -> dict:
        methods = Counter(s.token_method for s in self.sequences)
        label_counts = {name: dict(Counter(str(s.labels.get(name)) for s in self.sequences))
                        for name in ("group", "failure_type")}
        return {"labels": label_counts,
            "sequences": len(self.sequences), "response_tokens": self.n_rows(),
            "token_methods": dict(methods), "skipped_for_context": len(self.skipped),
            "skipped": self.skipped, "max_context": self.max_context,
            "context_policy": self.context_policy, "sequences_fingerprint": self.fingerprint(),
            "tokenizer": self.tokenizer,
        }


def _requested(rollouts: pd.DataFrame, problems, rollout_ids) -> tuple[pd.DataFrame, list, dict]:
    """The rollouts table indexed by id, the ids to force and the problem texts, after
    refusing duplicate, unknown or problem-less rollouts."""
    need = {"rollout_id", "problem_id"}
    if missing := need - set(rollouts.columns):
        raise ValueError(f"rollouts table lacks columns {sorted(missing)}")
    dup = rollouts["rollout_id"][rollouts["rollout_id"].duplicated()].unique().tolist()
    if dup:
        raise ValueError(f"rollouts table has duplicate rollout ids, e.g. {dup[:5]}: "
                         "rebuild it (rollout_id must be unique)")
    if isinstance(problems, pd.DataFrame):
        problem_text = dict(zip(problems["problem_id"].astype(str), problems["problem"]))
    else:
        problem_text = {str(k): v for k, v in dict(problems).items()}
    table = rollouts.set_index("rollout_id", drop=False)
    if rollout_ids is None:
        wanted = list(rollouts["rollout_id"])
    else:
        wanted = list(rollout_ids)
        if dup := [r for r, c in Counter(wanted).items() if c > 1]:
            raise ValueError(f"rollout ids requested twice: {dup[:5]}")
        unknown = [r for r in wanted if r not in table.index]
        if unknown:
            raise KeyError(f"{len(unknown)} requested rollout ids do not exist in the rollouts "
                           f"table, e.g. {unknown[:5]}; check the ids (or rerun notebook 02)")
    missing_problems = sorted({str(table.at[r, "problem_id"]) for r in wanted}
                              - set(problem_text))
    if missing_problems:
        raise KeyError(f"{len(missing_problems)} problems of the rollouts are missing from the "
                       f"problems table, e.g. {missing_problems[:5]}")
    return table, wanted, problem_text


def build_sequences(rollouts: pd.DataFrame, problems, tokenizer,
                    template: str = prompting.DEFAULT_TEMPLATE,
                    rollout_ids: Iterable[str] | None = None, max_context: int | None = None,
                    context_policy: str = "skip", progress: bool = True) -> SequenceSet:
    """Forced sequences from a rollouts table (schemas.ROLLOUTS columns).

    problems: a DataFrame with problem_id and problem, or a mapping id -> problem text.
    rollout_ids: which rollouts (default all, in table order); unknown ids are refused.
    max_context: the smallest context of the models to be forwarded (model_context());
    longer sequences are skipped and counted (policy "skip") or refused ("error").
    """
    if context_policy not in CONTEXT_POLICIES:
        raise ValueError(f"context_policy must be one of {CONTEXT_POLICIES}, "
                         f"got {context_policy!r}")
    table, wanted, problem_text = _requested(rollouts, problems, rollout_ids)
    ident = tokenizers.tokenizer_identity(tokenizer)
    prompt_cache: dict[str, list[int]] = {}
    sequences, skipped, empty = [], [], []
    for rid in tqdm(wanted, desc="forced sequences", disable=not progress, leave=False):
        row = table.loc[rid]
        pid = str(row["problem_id"])
        if pid not in prompt_cache:
            prompt_cache[pid] = prompting.prompt_ids(tokenizer, problem_text[pid], template)
        prompt = prompt_cache[pid]
        stored_prompt = row.get("prompt_ids", None)
        if stored_prompt is not None and len(stored_prompt) and list(map(int, stored_prompt)) != prompt:
            raise ValueError(
                f"rollout {rid!r} was sampled from another prompt than "
                "prompting.prompt_ids(tokenizer, problem, template) gives now (template or "
                "tokenizer changed?); force with the template the rollouts were made with")
        method = row.get("token_method", "generated") or "generated"
        stored = row.get("response_ids", None)
        stored = [] if stored is None else [int(i) for i in stored]
        if method == "text":
            text = row.get("response", "") or ""
            response = prompting.text_ids(tokenizer, text)
            if stored and stored != list(response):
                raise ValueError(f"rollout {rid!r}: stored response_ids differ from the "
                                 "tokenization of its text (prompting.text_ids)")
        elif method == "generated":
            response = stored
        else:
            raise ValueError(f"rollout {rid!r}: unknown token_method {method!r}; "
                             f"expected one of {TOKEN_METHODS}")
        if not response:
            empty.append(rid)
            continue
        total = len(prompt) + len(response)
        if max_context is not None and total > max_context:
            if context_policy == "error":
                raise ValueError(f"rollout {rid!r} has {total} tokens, more than the model "
                                 f"context {max_context}; use context_policy='skip' to skip "
                                 "and count such rollouts")
            skipped.append({"rollout_id": rid, "tokens": total, "reason": "context"})
            continue
        seq = make_sequence(rid, pid, prompt, response, method, tokenizer)
        seq.labels = {name: _plain(row.get(name)) for name in LABELS if name in row.index}
        sequences.append(seq)
    if empty:
        raise ValueError(f"{len(empty)} rollouts have an empty response, e.g. {empty[:5]}: "
                         "nothing to force; exclude them with rollout_ids or regenerate them")
    if not sequences:
        raise ValueError("no rollout left to force (all skipped for context?)")
    return SequenceSet(sequences, skipped, ident, max_context, context_policy)


def _plain(value):
    """A label as a plain JSON-able value (numpy scalars and NaN made explicit)."""
    if value is None:
        return None
    if isinstance(value, (float, np.floating)):
        return None if np.isnan(value) else float(value)
    return value.item() if isinstance(value, np.generic) else value

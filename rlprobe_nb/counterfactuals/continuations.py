"""Seeded continuations of ``prompt + response[:k]`` (optionally with one token swapped in).

A *context* is the chat prompt of a problem followed by the first k tokens of a response,
possibly with its (k+1)-th token replaced by another one (a branch). A model writes
``n`` continuations of each context; the response graded afterwards is the context's
response part followed by the continuation, decoded together.

Reproducibility. Continuation ``s`` of a context has its own random stream, seeded with
``statistics.seed_from("continuation", seed, rollout_id, k, substituted, s)``: its j-th
token is ``sampling.draw`` under (that seed, j) at the context's temperature. The seed
names the context, not the model, so every policy continuing a context draws with the
same noise (common random numbers: a difference between two models' pass rates at a
context is theirs, not the draws'). A continuation does not depend on which other
continuations share the batch or on the number of devices: only floating-point
differences between batch shapes remain, which could flip a draw that falls exactly on a
boundary between two tokens (see ``rollouts``).

Cost. The expensive part of counterfactuals is generation: every context costs ``n``
continuations, decoded by the book's decode loop (``generation.decoding``): slots that
are refilled as continuations end, each context's text prefilled once for its ``n``
samples. A continuation stops at EOS, when the response reaches ``max_new_tokens``
tokens in all (the rollouts' limit, counted from the response's first token), at
``max_continuation`` new tokens where the context sets one, and with ``stop_at_box`` once
its own new text has closed a ``\\boxed{...}`` (finish reason "box"): the grader reads
the last box, so nothing written after it changes the grade. A box in the context (the
reference's own) does not stop it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rlprobe_nb.generation import decoding
from rlprobe_nb.generation.rollouts import eos_ids
from rlprobe_nb.problems import grading
from rlprobe_nb.progress import tqdm
from rlprobe_nb.statistics import seed_from


@dataclass(frozen=True)
class Context:
    """A context to continue: ``prompt_ids + response_ids`` (the response part already
    cut at k and with any substituted token in place), and how long a response may get."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    max_new_tokens: int  # limit on the whole response, prefix included
    max_continuation: int | None = None  # limit on the new tokens (None: the response's)

    @property
    def budget(self) -> int:
        left = self.max_new_tokens - len(self.response_ids)
        return left if self.max_continuation is None else min(left, int(self.max_continuation))

    @property
    def ids(self) -> tuple[int, ...]:
        return self.prompt_ids + self.response_ids


def branch_response(response_ids: Sequence[int], k: int, substituted: int | None) -> tuple[int, ...]:
    """The response part of a context: the first ``k`` tokens, then ``substituted`` when a
    token is swapped in for token k."""
    if not 0 <= k <= len(response_ids):
        raise ValueError(f"prefix length {k} outside the response (0..{len(response_ids)})")
    head = tuple(int(t) for t in response_ids[:k])
    return head if substituted is None else head + (int(substituted),)


def continuation_seed(seed: int, rollout_id: str, k: int, substituted: int | None,
                      sample: int) -> int:
    """The seed of continuation ``sample`` of a context: a function of what the context is,
    never of which model continues it or where it was computed."""
    return seed_from("continuation", int(seed), rollout_id, int(k),
                     "keep" if substituted is None else int(substituted), int(sample))


class BoxWatch:
    """Whether a row's new text has closed a box (``grading.extract_boxed`` finds one);
    a row's text is decoded only after a token that holds "}"."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._closes: dict[int, bool] = {}

    def closes(self, token: int) -> bool:
        if token not in self._closes:
            self._closes[token] = "}" in self.tokenizer.decode([token])
        return self._closes[token]

    def closed(self, new_ids: list[int]) -> bool:
        return bool(new_ids) and self.closes(new_ids[-1]) and bool(grading.extract_boxed(
            self.tokenizer.decode(new_ids, skip_special_tokens=True)))

    def reason(self, new_ids: list[int]) -> str | None:
        """"box" once the new text has closed a box (the decode loop's ``finish``)."""
        return "box" if self.closed(new_ids) else None


def continue_contexts(model, tokenizer, contexts: list[Context], seeds: list[list[int]],
                      temperature: float, batch_rows: int = 32, progress: bool | str = False,
                      stop_at_box: bool = False) -> list[list[tuple[list[int], str]]]:
    """``len(seeds[c])`` continuations of each context ``c`` (one per seed), ``batch_rows``
    decoded at a time; returns, per context, (new token ids, finish_reason) per sample.

    Contexts whose budget is used up (the prefix already has ``max_new_tokens`` tokens)
    get no continuation: ([], "length") for every sample.
    """
    n = {len(s) for s in seeds}
    if len(n) > 1 or len(seeds) != len(contexts):
        raise ValueError("every context needs the same number of seeds, one list per context")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    n_samples = n.pop() if n else 0
    out: list[list] = [[([], "length")] * n_samples for _ in contexts]
    pairs = [(c, s) for c, ctx in enumerate(contexts) if ctx.budget > 0 for s in range(n_samples)]
    requests = [decoding.Request(contexts[c].ids, float(temperature), int(seeds[c][s]),
                                 contexts[c].budget) for c, s in pairs]
    label = progress if isinstance(progress, str) else "continuations"
    bar = tqdm(total=len(pairs), desc=label, disable=progress is False, leave=False)
    box = BoxWatch(tokenizer) if stop_at_box else None
    results = decoding.generate(model, requests, eos_ids(model, tokenizer), slots=batch_rows,
                                pad=tokenizer.pad_token_id, progress=lambda: bar.update(1),
                                finish=box.reason if box else None)
    bar.close()
    for (c, s), result in zip(pairs, results):
        out[c][s] = result
    return [list(per) for per in out]

"""What notebook 03 forces, for which models, in which order — on top of the engine in
``forcing``. Each model of the suite is forwarded over the chosen rollouts at most once:
the reference on the first run (its cache serves every checkpoint), each checkpoint in its
own run, and every configured pair whose two caches exist is computed from the caches.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import forcing, models, provenance, storage
from .params import Params


def select_rollouts(rollouts: pd.DataFrame, which: str = "wrong",
                    limit: int | None = None) -> pd.DataFrame:
    """The rollouts to force: wrong (default), right (a control) or all. With ``limit``,
    sample 0 of every problem first, then sample 1, ..., so every problem is represented."""
    if which not in ("wrong", "right", "all"):
        raise ValueError(f"which must be 'wrong', 'right' or 'all', got {which!r}")
    chosen = rollouts if which == "all" else rollouts[rollouts.correct == (which == "right")]
    if chosen.empty:
        raise ValueError(f"no {which} rollouts in the rollouts table ({len(rollouts)} rows): "
                         "rerun notebook 02 with more problems or samples, or set forcing.which")
    if not limit:
        return chosen
    spread = chosen.assign(_rank=chosen.groupby("problem_id").cumcount())
    keep = spread.sort_values(["_rank", "problem_id"], kind="stable").head(limit).index
    return chosen.loc[chosen.index.isin(keep)]


def engine_settings(P: Params) -> dict:
    return dict(suite=P.suite, batch_tokens=P.forcing.batch_tokens,
                chunk_positions=P.forcing.chunk_positions, topk=P.forcing.topk,
                compile_body=P.forcing.compile_body,
                device=models.resolve_device(P.runtime.device))


def sequences(P: Params, chosen: pd.DataFrame, problems: pd.DataFrame,
              loaded: models.LoadedModel | None = None) -> forcing.SequenceSet:
    """Forced sequences for the chosen rollouts, checked against the model's context."""
    tok = loaded.tokenizer if loaded else models.load_tokenizer(P.reference, P)
    context = forcing.model_context(loaded.model) if loaded else None
    return forcing.build_sequences(chosen, problems, tok, P.prompt_template,
                                   max_context=context, context_policy=P.forcing.context_policy)


def is_cached(P: Params, name: str, seqs: forcing.SequenceSet) -> bool:
    cache = forcing.HiddenCache(forcing.hidden_dir(P.suite, name))
    return cache.exists() and not cache.missing(seqs.sequences)


def ensure_cached(P: Params, name: str, seqs: forcing.SequenceSet) -> None:
    """Forward ``name`` over the sequences into its hidden-state cache unless it is there
    (for the reference: the one-time cost that every checkpoint then reuses)."""
    if is_cached(P, name, seqs):
        return
    lm = models.load_model(name, P)
    side = forcing.Side(name, lm.model, lm.tokenizer, forcing.hidden_dir(P.suite, name))
    forcing.forward_to_cache(seqs, side, **engine_settings(P))


def needs_cache(P: Params, name: str) -> bool:
    """Whether a configured pair will read this model's hidden states later. Saving them
    costs disk traffic (8 KB a token at 8B), so a checkpoint in no pair skips it."""
    return any(name in pair for pair in P.forcing.pairs)


def run_checkpoint(P: Params, seqs: forcing.SequenceSet, ckpt: models.LoadedModel) -> Path:
    """Forward the checkpoint once; compare it with the cached reference as it goes."""
    ensure_cached(P, P.reference, seqs)
    cache = forcing.hidden_dir(P.suite, P.checkpoint) if needs_cache(P, P.checkpoint) else None
    ref_prov = {"name": P.reference, **P.model_spec(P.reference)}
    man = provenance.manifest(P, models=[ckpt.provenance, ref_prov],
                              extra={"sequences": seqs.facts()})
    return forcing.run_checkpoint(
        seqs, forcing.Side(P.checkpoint, ckpt.model, ckpt.tokenizer, cache),
        forcing.Side(P.reference, cache_dir=forcing.hidden_dir(P.suite, P.reference)),
        forcing.pair_dir(P.suite, P.checkpoint, P.reference), provenance=man,
        **engine_settings(P))


def extra_pairs(P: Params) -> list[tuple[str, str]]:
    """Configured pairs this run can complete: those with this checkpoint whose other
    model is already cached, and pairs of non-checkpoint models (e.g. DPO vs SFT)."""
    out = []
    for a, b in map(tuple, P.forcing.pairs):
        if P.checkpoint in (a, b) or not ({a, b} & set(P.steps)):
            out.append((a, b))
    return out


def run_cached_pairs(P: Params, seqs: forcing.SequenceSet) -> list[Path]:
    """Every extra pair that can run now, from the two caches: no forward of a checkpoint."""
    done = []
    for a, b in extra_pairs(P):
        folder = forcing.pair_dir(P.suite, a, b)
        # Checkpoints are forwarded only by their own run of 03; wait for both caches.
        checkpoints = [m for m in (a, b) if m in P.steps]
        if storage.is_complete(folder) or not all(is_cached(P, m, seqs) for m in checkpoints):
            continue
        for name in (a, b):
            if name not in P.steps:
                ensure_cached(P, name, seqs)
        man = provenance.manifest(P, models=[{"name": m, **P.model_spec(m)} for m in (a, b)])
        forcing.compare_cached(seqs, a, b, folder, provenance=man, **engine_settings(P))
        done.append(folder)
    return done

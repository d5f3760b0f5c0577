"""The key of every table the book writes for a suite, built from its parameters, the
models' identities and the keys of the tables it is computed from (see ``keys``).

    problems  <- the problem source (file hash, generator version, filters)
    answers   <- problems, reference and target identities, sampling, grader
    selection <- answers, thresholds
    rollouts  <- selection, problems, the reference (or the imported file), sampling, grader
    tokens    <- rollouts, both models' identities, dtype, the forcing policy, top-k

``current_sha(P, table)`` checks that a table on disk is current: intact, and its key equal
to the one its inputs give *now* (rebuilt with the notebook overrides it was written
with, which its manifest records). A notebook reads its inputs through ``read_current``,
so a table computed from other inputs is refused, naming what changed and the notebook
to rerun, never served as current.
"""

from __future__ import annotations

import dataclasses
from importlib import metadata
from typing import Callable

import pandas as pd

from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import keys, storage
from rlprobe_nb.tables.provenance import sha256_file

PRODUCERS = {
    "problems": "notebooks/01_filtering", "answers": "notebooks/01_filtering",
    "selection": "notebooks/01_filtering", "rollouts": "notebooks/02_rollouts",
    "tokens": "notebooks/03_teacher_forcing",
}
UNIQUE = {
    "problems": ["problem_id"], "answers": ["model", "problem_id", "sample"],
    "selection": ["problem_id"], "rollouts": ["rollout_id"],
}


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def grader(P: params.Params) -> dict:
    """What verdicts depend on: the grader's own version, math-verify's, the timeout."""
    from rlprobe_nb.problems import grading
    return {"version": getattr(grading, "GRADER_VERSION", "1"),
            "math_verify": _version("math-verify"),
            "latex2sympy2_extended": _version("latex2sympy2_extended"),
            "timeout_s": P.grading.timeout_s}


def problems(P: params.Params) -> dict:
    src = dataclasses.asdict(P.problems)
    if src["source"] in ("file", "prior"):
        if not src.get("path"):
            raise params.ParamsError(f"problems.source is {src['source']!r} but problems.path "
                                     "is not set")
        src["file_sha256"] = sha256_file(paths.resolve(src.pop("path")))
    elif src["source"] == "demo":
        from rlprobe_nb.problems import arithmetic
        src["generator"] = arithmetic.GENERATOR_VERSION
    elif src["source"] == "hub":
        src["datasets"] = _version("datasets")
    return keys.stage("problems", source=src)


def _decoder(P: params.Params) -> dict:
    """The decode loop's setting when it is not the default: a compiled step draws tokens
    that differ in the last bits (absent otherwise, so default keys stay as they were)."""
    return {"decode": "compiled"} if P.runtime.compile_decode else {}


def answers(P: params.Params, problems_sha: str) -> dict:
    F = P.filtering
    names = list(dict.fromkeys([P.reference, P.target]))
    return keys.stage(
        "answers", problems=problems_sha, dtype=P.runtime.dtype, template=P.prompt_template,
        models={name: models.model_identity(name, P) for name in names},
        sampling={"n_samples": F.n_samples, "temperature": F.temperature,
                  "max_new_tokens": F.max_new_tokens, "seed": F.seed, "batch_size": F.batch_size},
        grader=grader(P), **_decoder(P))


def selection(P: params.Params, answers_sha: str) -> dict:
    F = P.filtering
    return keys.stage(
        "selection", answers=answers_sha, reference=P.reference, target=P.target,
        thresholds={"ref_max_pass": F.ref_max_pass, "target_min_pass": F.target_min_pass,
                    "control_ref_min_pass": F.control_ref_min_pass,
                    "control_target_max_pass": F.control_target_max_pass})


def rollouts(P: params.Params, selection_sha: str, problems_sha: str) -> dict:
    R = P.rollouts
    parts = {"selection": selection_sha, "problems": problems_sha, "source": R.source,
             "template": P.prompt_template, "grader": grader(P),
             "reference": models.model_identity(P.reference, P)}
    if R.source == "generate":
        parts.update(dtype=P.runtime.dtype, sampling={
            "n_per_problem": R.n_per_problem, "temperatures": R.temperatures,
            "max_new_tokens": R.max_new_tokens, "seed": R.seed, "batch_size": R.batch_size},
            **_decoder(P))
    else:
        if not R.prior_path:
            raise params.ParamsError("rollouts.source is 'prior' but rollouts.prior_path is not set")
        parts["prior_sha256"] = sha256_file(paths.resolve(R.prior_path))
    return keys.stage("rollouts", **parts)


def tokens_inputs(P: params.Params, checkpoint: str, reference: str, rollouts_sha: str) -> dict:
    """The caller's part of a token table's key (forcing.table_key adds the sequences,
    top-k and the engine's version)."""
    F = P.forcing
    return {"rollouts": rollouts_sha, "dtype": P.runtime.dtype,
            "models": {name: models.model_identity(name, P) for name in (checkpoint, reference)},
            "forcing": {"groups": F.groups, "failure_types": F.failure_types,
                        "max_rollouts": F.max_rollouts, "seed": F.seed,
                        "context_policy": F.context_policy}}


# --------------------------------------------------------------------------- currency

_UPSTREAM: dict[str, tuple[str, ...]] = {
    "problems": (), "answers": ("problems",), "selection": ("answers",),
    "rollouts": ("selection", "problems"),
}
_BUILD: dict[str, Callable[..., dict]] = {
    "problems": lambda P: problems(P),
    "answers": lambda P, problems: answers(P, problems),
    "selection": lambda P, answers: selection(P, answers),
    "rollouts": lambda P, selection, problems: rollouts(P, selection, problems),
}


def folder(P: params.Params, table: str):
    return paths.table_dir(P.suite, table)


def as_written(P: params.Params, man: dict, checkpoint: str | None = None) -> params.Params:
    """The suite's parameters as the notebook that wrote a table had them: today's files
    with the notebook overrides recorded in its manifest."""
    return params.load(P.suite, checkpoint, overrides=man.get("overrides") or {})


def expected(P: params.Params, table: str) -> dict:
    """The key the table would have if it were computed now from its current inputs."""
    man = storage.read_manifest(folder(P, table))
    ups = {u: current_sha(P, u) for u in _UPSTREAM[table]}
    return _BUILD[table](as_written(P, man), **ups)


def current_sha(P: params.Params, table: str) -> str:
    """The key hash of ``table`` after checking that it is intact and current."""
    where = folder(P, table)
    if not storage.is_complete(where):
        raise FileNotFoundError(f"{where} is missing or unfinished: run "
                                f"{PRODUCERS[table]} first")
    man = storage.verify(where)
    storage.check_key(where, man, expected(P, table))
    return man["key_sha"]


def read_current(P: params.Params, table: str) -> tuple[pd.DataFrame, str]:
    """(rows, key hash) of a table after checking that it is intact and current."""
    sha = current_sha(P, table)
    return storage.read_table(folder(P, table)), sha


def tokens_current(P: params.Params, checkpoint: str, reference: str, where=None) -> str:
    """Check a token table against its current inputs (the rollouts it forced, both
    models, the forcing policy, top-k, the engine's version); returns its key hash."""
    from rlprobe_nb import forcing
    where = where or forcing.pair_dir(P.suite, checkpoint, reference)
    if not storage.is_complete(where):
        raise FileNotFoundError(f"{where} is missing or unfinished: run {PRODUCERS['tokens']} "
                                f"-p checkpoint {checkpoint}")
    man = storage.verify(where)
    ckpt = checkpoint if checkpoint in P.steps else None
    P_up = as_written(P, man, ckpt)
    want = {"inputs": tokens_inputs(P_up, checkpoint, reference, current_sha(P, "rollouts")),
            "topk": P_up.forcing.topk, "version": keys.STAGE_VERSIONS["tokens"]}
    have = {k: (man.get("key") or {}).get(k) for k in want}
    if keys.key_sha(have) != keys.key_sha(want):
        raise storage.StaleTableError(
            f"{where} was computed from other inputs than the current ones "
            f"({keys.describe_difference(have, want)}); rerun {PRODUCERS['tokens']} "
            f"-p checkpoint {checkpoint} (with -p overwrite True)")
    return man["key_sha"]

"""What a table's key is, and whether a table is current: the lineage of every table.

A table's *key* is a mapping of everything its rows depend on, in named parts:

  table     what the table is (``answers``, ``tokens``, ``spikes`` ...)
  inputs    the key hash of each table it was computed from, by its folder under the
            suite's data folder (``rollouts``, ``tokens/rlvr_step_1200__vs__dpo``)
  params    the suite parameters its rows depend on, by dotted name
  models    the identity of each model it used (``suite.models.model_identity``: file
            hashes or the hub commit, tokenizer and chat template included)
  files     the sha256 of each input file a parameter names (``problems.path``)
  code      the sha256 of each source file of the code that computes its rows
            (``CODE`` says which files, per table; a changed file is named)
  packages  the versions of the packages its rows depend on (the grader's)
  settings  the producing notebook's own choices (its parameters, the forced sequences)

The key hash covers the inputs' key hashes, so a change anywhere upstream changes every
key below it (a Merkle DAG, as in DVC or Nix). The manifest records the key, so a table's
lineage is read from its manifest; nothing is derived again from files the key does not
name.

A table is *current* when it is intact (``storage.verify``) and every part of its key
but ``settings`` is what the suite gives now: its inputs current with the recorded key
hashes, the parameters as the notebook that wrote it had them (today's files with the
overrides its manifest records, built from the suite as loaded: ``params.variant``),
the same model identities, input files, source files and package versions. Each check is
made once per loaded suite (``P``): model identities, source hashes and the currency of
each table are remembered on ``P``, so a notebook that reads the token tables and then
writes a table computed from them hashes no file and reads no YAML for the write. Load
the parameters again (rerun the notebook's first cells) to see files changed since.

Same key: reuse and say so. Different key: the writing notebook refuses, naming each
difference, unless run with ``overwrite=True``; a reader refuses a stale table
(``StaleTableError``) naming the difference and the notebook to rerun. Batch and chunk
sizes are in no key: they move a value only by float32 rounding, within
``forcing.precision.BATCH_TOLERANCE`` (measured in the tests), and a token table's
manifest names every batch size its rows were computed at.
"""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import keys, storage
from rlprobe_nb.tables.provenance import sha256_file

StaleTableError = storage.StaleTableError

PRODUCERS = {
    "problems": "notebooks/01_filtering", "answers": "notebooks/01_filtering",
    "selection": "notebooks/01_filtering", "rollouts": "notebooks/02_rollouts",
    "tokens": "notebooks/03_teacher_forcing", "spikes": "notebooks/05_spikes",
    "spike_regions": "notebooks/05_spikes", "branches": "notebooks/08_counterfactuals",
    "takeover": "notebooks/09_takeover",
}
UNIQUE = {
    "problems": ["problem_id"], "answers": ["model", "problem_id", "sample"],
    "selection": ["problem_id"], "rollouts": ["rollout_id"],
}

# The source files (relative to the package) whose code computes each table's rows.
_GRADER = ("problems/grading.py", "problems/grading_pool.py")
_SAMPLING = ("generation/*.py", "suite/prompting.py") + _GRADER
_STATS = ("statistics.py",)
# The code that builds a model from its files (the merge of an adapter, the decoding of a
# compact one, the GGUF conversion, the loader, the stop tokens): in the key of every
# table computed by running a model, and so, through their keys, of every table below.
MODEL_CODE = ("suite/models.py", "suite/lora_merge.py", "suite/compact_adapters.py",
              "suite/gguf_cache.py", "suite/stop_tokens.py")
CODE: dict[str, tuple[str, ...]] = {
    "problems": ("problems/sources.py", "problems/arithmetic.py"),
    "answers": _SAMPLING + MODEL_CODE,
    "selection": ("problems/filtering.py",) + _STATS,
    "rollouts": _SAMPLING + MODEL_CODE + ("problems/sources.py",),
    "tokens": ("forcing/*.py", "suite/prompting.py", "suite/tokenizers.py") + MODEL_CODE,
    "divergence": ("divergence/*.py",) + _STATS,
    "spikes": ("spikes/*.py", "views.py") + _STATS,
    "branches": ("counterfactuals/*.py",) + _SAMPLING + MODEL_CODE + _STATS,
    "takeover": ("takeover/lockstep.py", "takeover/criteria.py", "takeover/sweep.py",
                 "takeover/table.py", "takeover/calibrated.py", "spikes/null.py",
                 "spikes/conditional.py", "spikes/statistic.py", "spikes/detector.py",
                 "problems/sources.py") + _SAMPLING + MODEL_CODE,
}
GRADER_PACKAGES = ("math-verify", "latex2sympy2_extended")


def code_of(table: str) -> tuple[str, ...]:
    """The source patterns of a table: its own entry, or its chapter's (``divergence_when``
    is computed by the code of ``divergence``, ``spike_regions`` by that of ``spikes``)."""
    if table in CODE:
        return CODE[table]
    for stage in ("divergence", "entropy", "estimator", "spike"):
        if table.startswith(stage):
            return CODE[{"entropy": "divergence", "estimator": "divergence",
                         "spike": "spikes"}.get(stage, stage)]
    raise KeyError(f"no source files are declared for table {table!r}: add it to lineage.CODE")


# --------------------------------------------------------------------- memo on P

def _memo(P: params.Params) -> dict:
    """What this loaded suite has checked already (shared with its variants)."""
    if "_lineage" not in P.__dict__:
        P.__dict__["_lineage"] = {"own": {}, "code": {}, "variants": {}}
    return P.__dict__["_lineage"]


def as_written(P: params.Params, man: dict) -> params.Params:
    """The suite's parameters as the notebook that wrote a table had them: the suite as
    ``P`` loaded it, for the checkpoint and with the overrides its manifest records."""
    checkpoint = (man.get("params") or {}).get("checkpoint")
    checkpoint = checkpoint if checkpoint in P.steps else None
    overrides = man.get("overrides") or {}
    memo = _memo(P)
    tag = keys.key_sha([checkpoint, overrides])
    if tag not in memo["variants"]:
        models.remembered_identities(P)  # made before the variant, so that it shares them
        memo["variants"][tag] = params.variant(P, checkpoint, overrides)
    return memo["variants"][tag]


# --------------------------------------------------------------------- ingredients

def param_value(P: params.Params, dotted: str) -> Any:
    value: Any = P
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def code_hashes(P: Optional[params.Params], patterns: tuple[str, ...]) -> dict:
    """{relative path: sha256 (16 hex)} of the package's source files matching
    ``patterns``, hashed once per loaded suite."""
    memo = _memo(P)["code"] if P is not None else {}
    tag = tuple(patterns)
    if tag not in memo:
        files = sorted({f for pattern in patterns for f in paths.PACKAGE_DIR.glob(pattern)
                        if f.is_file() and "__pycache__" not in f.parts})
        memo[tag] = {"patterns": list(patterns), "files": {
            f.relative_to(paths.PACKAGE_DIR).as_posix():
                hashlib.sha256(f.read_bytes()).hexdigest()[:16] for f in files}}
    return memo[tag]


def package_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _file_sha(P: params.Params, dotted: str) -> Optional[str]:
    where = param_value(P, dotted)
    if not where:
        return None
    path = paths.resolve(where)
    if not path.is_file():
        raise FileNotFoundError(f"{dotted} names {path}, which does not exist: fix the "
                                f"parameter in {P.files[0]}")
    return sha256_file(path)


def key(P: params.Params, table: str, *, inputs: Optional[dict[str, str]] = None,
        params_used: tuple[str, ...] = (), models_used: tuple[str, ...] = (),
        files: tuple[str, ...] = (), packages: tuple[str, ...] = (),
        settings: Optional[dict] = None) -> dict:
    """A table's key from its ingredients (see the module docstring); ``inputs`` maps each
    input table's folder (under the suite's data folder) to its key hash."""
    return {
        "table": table,
        "inputs": dict(sorted((inputs or {}).items())),
        "params": {name: param_value(P, name) for name in params_used},
        "models": {name: models.model_identity(name, P) for name in models_used},
        "files": {name: _file_sha(P, name) for name in files},
        "code": code_hashes(P, code_of(table)),
        "packages": {name: package_version(name) for name in packages},
        "settings": settings or {},
    }


def _patterns_now(have: dict) -> tuple[str, ...]:
    """The source patterns a table's code is declared by today (``CODE``): a file added
    to a table's code since it was written makes it stale, naming the file. A table of no
    declared stage keeps the patterns its key recorded."""
    try:
        return code_of(str(have.get("table")))
    except KeyError:
        return tuple((have.get("code") or {}).get("patterns") or ())


def recompute(P: params.Params, have: dict, man: dict) -> dict:
    """The key a table would have now, from its recorded key's ingredient names: its
    inputs' current key hashes (checked each time: an input may have been rewritten since)
    and the rest as this loaded suite gives it (remembered: it depends on the suite alone)."""
    memo = _memo(P)["own"]
    tag = keys.key_sha(have)
    if tag not in memo:
        Pw = as_written(P, man)
        memo[tag] = {
            "table": have.get("table"),
            "params": {name: param_value(Pw, name) for name in have.get("params") or {}},
            "models": {name: models.model_identity(name, Pw) for name in have.get("models") or {}},
            "files": {name: _file_sha(Pw, name) for name in have.get("files") or {}},
            "code": code_hashes(P, _patterns_now(have)),
            "packages": {name: package_version(name) for name in have.get("packages") or {}},
            "settings": have.get("settings") or {},
        }
    inputs = {name: current_sha(P, name) for name in have.get("inputs") or {}}
    return {**memo[tag], "inputs": inputs}


# --------------------------------------------------------------------- tables of 01-03
# Which parameters, models and files the rows of each table depend on.

def problems_key(P: params.Params) -> dict:
    source = P.problems.source
    if source in ("file", "prior") and not P.problems.path:
        raise params.ParamsError(f"problems.source is {source!r} but problems.path is not set")
    return key(P, "problems", params_used=tuple(
        f"problems.{k}" for k in ("source", "hub_id", "config", "split", "path", "levels",
                                  "subjects", "limit", "n", "seed", "split_name")),
        files=("problems.path",), packages=("datasets",) if source == "hub" else ())


def _sampling_params(section: str, names: tuple[str, ...], P: params.Params) -> tuple:
    # the compiled decode step draws tokens that differ in the last bits
    return ("runtime.dtype", "prompt_template", "grading.timeout_s",
            *(f"{section}.{k}" for k in names),
            *(("runtime.compile_decode",) if P.runtime.compile_decode else ()))


def answers_key(P: params.Params, problems_sha: str) -> dict:
    return key(P, "answers", inputs={"problems": problems_sha},
               params_used=("reference", "target") + _sampling_params(
                   "filtering", ("n_samples", "temperature", "max_new_tokens", "seed",
                                 "batch_size"), P),
               models_used=tuple(dict.fromkeys([P.reference, P.target])),
               packages=GRADER_PACKAGES)


def selection_key(P: params.Params, answers_sha: str) -> dict:
    return key(P, "selection", inputs={"answers": answers_sha}, params_used=(
        "reference", "target", "filtering.ref_max_pass", "filtering.target_min_pass",
        "filtering.control_ref_min_pass", "filtering.control_target_max_pass"))


def rollouts_key(P: params.Params, selection_sha: str, problems_sha: str) -> dict:
    R = P.rollouts
    if R.source in ("prior", "imported") and not R.prior_path:
        raise params.ParamsError(f"rollouts.source is {R.source!r} but rollouts.prior_path "
                                 "is not set")
    sampling = _sampling_params("rollouts", ("n_per_problem", "temperatures",
                                             "max_new_tokens", "seed", "batch_size"), P)
    return key(P, "rollouts", inputs={"selection": selection_sha, "problems": problems_sha},
               params_used=("reference", "rollouts.source") + (
                   sampling if R.source == "generate" else ("prompt_template",
                                                            "grading.timeout_s")),
               models_used=(P.reference,), files=("rollouts.prior_path",),
               packages=GRADER_PACKAGES)


def tokens_key(P: params.Params, checkpoint: str, reference: str, rollouts_sha: str) -> dict:
    """A token table's key before the engine adds the forced sequences and top-k to its
    settings (``forcing.table_key``)."""
    return key(P, "tokens", inputs={"rollouts": rollouts_sha},
               params_used=("runtime.dtype", "forcing.groups", "forcing.failure_types",
                            "forcing.max_rollouts", "forcing.seed", "forcing.context_policy",
                            "forcing.topk", "prompt_template"),
               models_used=tuple(dict.fromkeys([checkpoint, reference])))


# --------------------------------------------------------------------- currency

def folder(P: params.Params, name: str) -> Path:
    """A table's folder from its name under the suite's data folder."""
    return paths.table_dir(P.suite, name)


def _producer(name: str, man: Optional[dict] = None) -> str:
    if man and man.get("producer"):
        return man["producer"]
    return PRODUCERS.get(name.split("/")[0], "the notebook that writes it")


def current_sha(P: params.Params, name: str) -> str:
    """The key hash of table ``name`` after checking that it is intact and current."""
    where = folder(P, name)
    if not storage.is_complete(where):
        hint = " -p checkpoint " + name.split("/")[1].split("__vs__")[0] \
            if name.startswith("tokens/") else ""
        raise FileNotFoundError(f"{where} is missing or unfinished: run "
                                f"{_producer(name)}{hint} first")
    man = storage.verify(where)
    have = man.get("key")
    if not isinstance(have, dict) or "code" not in have:
        raise StaleTableError(
            f"{where} was written by an earlier version of the book (its key records no "
            f"lineage); rerun {_producer(name, man)} (with -p overwrite True)")
    now = recompute(P, have, man)
    if keys.key_sha(now) != man.get("key_sha"):
        raise StaleTableError(
            f"{where} was computed from other inputs than the current ones "
            f"({keys.describe_difference(have, now)}); rerun {_producer(name, man)} "
            "(with -p overwrite True where it refuses to replace the table)")
    return man["key_sha"]


def read_current(P: params.Params, name: str, columns: Optional[list[str]] = None
                 ) -> tuple[pd.DataFrame, str]:
    """(rows, key hash) of a table after checking that it is intact and current."""
    sha = current_sha(P, name)
    return storage.read_table(folder(P, name), columns=columns), sha


def plan_reuse(where: Path, want: dict, overwrite: bool = False) -> bool:
    """Before any expensive work: True when the table is complete with this key (reuse);
    False when it must be computed; StaleTableError naming the differences when it holds
    another key (unless ``overwrite``)."""
    return storage.plan_reuse(where, want, overwrite)


# --------------------------------------------------------------------- derived tables

def token_table_names(P: params.Params, pairs: Optional[list[tuple[str, str]]] = None
                      ) -> list[str]:
    pairs = pairs or [(c, P.reference) for c in P.checkpoints]
    return [paths.token_table_name(c, r) for c, r in pairs]


def token_shas(P: params.Params, pairs: Optional[list[tuple[str, str]]] = None) -> dict[str, str]:
    """The key hash of every complete token table of ``pairs`` (default: each checkpoint
    vs the reference), each checked current: what a table computed from them depends on."""
    return {name: current_sha(P, name) for name in token_table_names(P, pairs)
            if storage.is_complete(folder(P, name))}


def derived_key(P: params.Params, table: str, settings: dict,
                inputs: Optional[dict[str, str]] = None) -> dict:
    """The key of a table computed from the suite's token tables (chapters 04 on): their
    key hashes (and any other ``inputs``), its code and its notebook's settings."""
    return key(P, table, inputs={**token_shas(P), **(inputs or {})}, settings=settings)


def write_derived(P: params.Params, table: str, frame: pd.DataFrame, schema, manifest: dict,
                  settings: dict, producer: str,
                  inputs: Optional[dict[str, str]] = None) -> None:
    """Write a table computed from the token tables; ``inputs``: the key hashes of any other
    tables it read (e.g. the placebo run's token tables, ``token_shas(P, pairs)``)."""
    storage.write_table(folder(P, table), frame, schema, {**manifest, "producer": producer},
                        key=derived_key(P, table, settings, inputs))


def read_derived(P: params.Params, table: str) -> pd.DataFrame:
    """A table computed from the token tables (e.g. ``spikes``), refused if anything it
    was computed from changed since (rerun the notebook that writes it)."""
    where = folder(P, table)
    if not storage.is_complete(where):
        raise FileNotFoundError(f"{where} is missing: run {_producer(table)} first")
    man = storage.read_manifest(where)
    have = man.get("key") or {}
    missing = sorted(set(token_shas(P)) - set(have.get("inputs") or {}))
    if missing:
        raise StaleTableError(
            f"{where} was computed before the token tables {missing} existed; rerun "
            f"{_producer(table, man)}")
    return read_current(P, table)[0]


def begin_derived(P: params.Params, table: str, settings: dict, schema, unique: list[str],
                  overwrite: bool, producer: str):
    """A sharded derived table: (the complete table, None) when one with the same key
    exists (said on the terminal), else (None, its begun ``<table>_shards`` work folder;
    other inputs are refused there unless ``overwrite``)."""
    where = folder(P, table)
    want = derived_key(P, table, settings)
    if storage.plan_reuse(where, want, overwrite):
        print(f"reusing {where}: complete, same inputs (key {keys.key_sha(want)})")
        return read_derived(P, table), None
    work = storage.ShardedTable(folder(P, f"{table}_shards"), schema, unique=unique)
    work.begin(want, overwrite=overwrite, what=f"({producer}, {table})")
    return None, work


"""The schema of a suite's parameters: its sections with their keys, types, defaults,
allowed choices and ranges, and the keys of a model spec. ``build_section`` checks one
section of a YAML file (or of notebook overrides) against it, naming the file, the key
and the fix for anything wrong, before any work starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Optional


class ParamsError(ValueError):
    """A parameter file or override is wrong; the message says where and how to fix it."""


@dataclass
class ProblemsParams:
    source: str = "demo"  # demo | hub | file | prior
    hub_id: Optional[str] = None
    config: Optional[str] = None
    split: str = "test"
    path: Optional[str] = None
    levels: Optional[list[int]] = None
    subjects: Optional[list[str]] = None
    limit: Optional[int] = None
    n: int = 24
    seed: int = 0
    split_name: str = "test"


@dataclass
class GradingParams:
    timeout_s: float = 5.0
    workers: int = 2


@dataclass
class FilteringParams:
    n_samples: int = 3
    temperature: float = 0.7
    max_new_tokens: int = 160
    seed: int = 0
    batch_size: int = 32
    ref_max_pass: float = 0.5
    target_min_pass: float = 0.5
    control_ref_min_pass: float = 0.5
    control_target_max_pass: float = 0.5


@dataclass
class RolloutsParams:
    source: str = "generate"  # generate | prior | imported
    # prior: an earlier run's filtered_problems.json; imported: the parquet that
    # python -m rlprobe_nb.import_rollouts wrote from a trainer's dump
    prior_path: Optional[str] = None
    n_per_problem: int = 5
    temperatures: list[float] = field(default_factory=lambda: [0.6, 0.7, 0.8, 0.9, 1.0])
    max_new_tokens: int = 160
    seed: int = 1234
    batch_size: int = 32


@dataclass
class ForcingParams:
    # What is forced (forcing_plan): the target group (the reference's wrong rollouts of
    # selected problems, of these failure types) and the contrast groups listed.
    groups: list[str] = field(default_factory=lambda: ["target", "ref_right", "control"])
    failure_types: list[str] = field(default_factory=lambda: ["boxed_wrong", "empty_box",
                                                              "no_box"])
    max_rollouts: Optional[int] = None  # per group, stratified by temperature and problem
    # a group's own cap instead, e.g. {t1_unselected: 15}: a control group or chapter 04's
    # T = 1 check may need fewer rollouts than the target group
    group_max_rollouts: dict[str, int] = field(default_factory=dict)
    seed: int = 0  # of the stratified draw under max_rollouts
    batch_tokens: int = 4096
    chunk_positions: int = 256
    topk: int = 5
    context_policy: str = "skip"  # skip | error
    pairs: list[list[str]] = field(default_factory=list)
    # torch.compile the decoder layers (inductor's deterministic mode: the same kernels in
    # every process, so a token table is the same for any number of GPUs). None: on CUDA
    compile_body: Optional[bool] = None


@dataclass
class CounterfactualsParams:
    # Chapter 08 (rlprobe_nb.counterfactuals): where it branches and how much is sampled.
    # Every context costs n continuations of up to its budget of new tokens (the response
    # limit minus its prefix, at most continuation_tokens), so these cap the cost.
    n: int = 16  # continuations per context and arm (one Wilson interval each)
    max_points: int = 24  # branch points (keep vs the checkpoint's top-1 alternative)
    # Where they come from, in order: "spikes" (chapter 05's significant spikes), then
    # ground-truth labels (divergence.ground_truth.LABELS); each source fills what is left
    point_rule: list[str] = field(default_factory=lambda: [
        "spikes", "result_first_wrong", "result_after_wrong", "final_answer", "result_correct",
        "operand", "operator"])
    # the points are disagreements (the checkpoint's top-1 is a real alternative to the
    # written token), their labels drawn in turn: each turn takes one point of every entry
    # (a label listed twice gets two per turn); "other": every label not listed here
    point_strata: list[str] = field(default_factory=lambda: [
        "result_first_wrong", "operand", "result_first_wrong", "operator", "other"])
    include_format: bool = False  # allow format tokens (\boxed{, $, whitespace) as points
    positive_points: int = 16  # first wrong digits for the positive control (keep vs correct)
    # where they come from: "forced" (the group's forced rollouts) or "problems" (also the
    # reference's other wrong rollouts of the same problems: a correct digit needs no forcing)
    positive_pool: str = "problems"
    grid_points: int = 8  # takeover-curve prefix lengths per case-study rollout
    case_studies: int = 2  # rollouts that get a whole takeover curve
    temperature: float = 0.7
    max_new_tokens: Optional[int] = None  # whole-response limit; None: the rollouts'
    continuation_tokens: Optional[int] = None  # new tokens per continuation; None: no limit
    stop_at_box: bool = True  # a continuation ends once it has closed a box (graded then)
    # the reference continues only problems it solves this often (None: it continues none)
    ref_min_pass: Optional[float] = 0.1
    # the placebo checkpoint at the checkpoint's step (where the suite has one) continues
    # the same contexts with the same draws: does the swap matter less without the reward?
    placebo: bool = True
    # the placebo also branches at its own disagreement points (its top-1 swapped in, the
    # placebo continuing; same rule, strata and seeds), at most this many (null: as many as
    # max_points; 0: none): the null for "does a change made without the reward's
    # information decide the answer?"
    placebo_points: Optional[int] = None
    caliper: float = 0.25  # controls: largest gap in the reference's entropy (nats)
    batch_rows: int = 32  # rows per generate call (not in any key: rows do not depend on it)
    seed: int = 0


@dataclass
class TakeoverParams:
    # Chapter 09 (rlprobe_nb.takeover): the reference writes a response, a checkpoint runs
    # in lock-step and takes over where a criterion says. Each checkpoint costs about
    # n_problems x samples x (1 + the distinct texts its rules write) responses through two
    # models (rules that write the same text share it).
    # the checkpoints that take over (null: the RLVR steps 100, 400 and the target where the
    # suite has them, else its first, middle and last, and the target's placebo)
    checkpoints: Optional[list[str]] = None
    n_problems: int = 100  # the first problems of the suite's problem source
    samples: int = 1  # responses per problem and rule (seeded per problem and sample)
    criteria: list[str] = field(default_factory=lambda: ["delta_logp", "kl", "entropy",
                                                         "random"])
    # shares of positions each criterion's threshold aims at: the threshold is the criterion's
    # (1 - budget) quantile over the checkpoint's forced positions (chapter 03's tables);
    # the share actually taken over is measured on the texts written
    budgets: list[float] = field(default_factory=lambda: [0.02, 0.05, 0.1, 0.2])
    temperature: float = 0.7
    max_new_tokens: Optional[int] = None  # None: the filtering answers' limit
    stop_at_box: bool = True  # a response ends once it has closed a box (graded then)
    batch_rows: int = 256  # distinct prefixes decoded at a time (not in any key; on CUDA at
    # most half the slots the free memory holds)
    seed: int = 0


@dataclass
class RuntimeParams:
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "float32"  # float32 | bfloat16 | float16
    # Sampling (01, 02) on CUDA: the decode step through torch.compile (about 20% faster per
    # step at 8B, two minutes of compilation per worker; tokens differ in the last bits, so
    # the answers and rollouts keys record it)
    compile_decode: bool = False


CHOICES = {
    "problems.source": ("demo", "hub", "file", "prior"),
    "rollouts.source": ("generate", "prior", "imported"),
    # t1_unselected: chapter 04's T = 1 control (forcing.plan), needs 1.0 in the temperatures
    "forcing.groups": ("target", "ref_right", "control", "t1_unselected"),
    "forcing.group_max_rollouts": ("target", "ref_right", "control", "t1_unselected"),
    "forcing.failure_types": ("correct", "boxed_wrong", "empty_box", "no_box", "truncated",
                              "imported"),
    "forcing.context_policy": ("skip", "error"),
    "runtime.device": ("auto", "cpu", "cuda"),
    "runtime.dtype": ("float32", "bfloat16", "float16"),
    "model.kind": ("hub", "local", "gguf", "peft"),
    # "spikes" and divergence.ground_truth.LABELS (suite/ imports no chapter package)
    "counterfactuals.positive_pool": ("forced", "problems"),
    "takeover.criteria": ("delta_logp", "kl", "entropy", "random", "calibrated"),
    "counterfactuals.point_strata": ("result_first_wrong", "operand", "operator", "other"),
    "counterfactuals.point_rule": ("spikes", "other", "format", "operator", "operand",
                                   "final_answer", "result_correct", "result_after_wrong",
                                   "result_first_wrong"),
}

# Allowed ranges (inclusive), checked at load so a bad value fails before any work.
RANGES = {
    "problems.n": (1, None), "problems.limit": (1, None),
    "grading.timeout_s": (0.01, 3600.0), "grading.workers": (1, 256),
    "filtering.n_samples": (1, None), "filtering.temperature": (0.0, 10.0),
    "filtering.max_new_tokens": (1, None), "filtering.batch_size": (1, None),
    "filtering.ref_max_pass": (0.0, 1.0), "filtering.target_min_pass": (0.0, 1.0),
    "filtering.control_ref_min_pass": (0.0, 1.0), "filtering.control_target_max_pass": (0.0, 1.0),
    "rollouts.n_per_problem": (1, None), "rollouts.temperatures": (0.0, 10.0),
    "rollouts.max_new_tokens": (1, None), "rollouts.batch_size": (1, None),
    "forcing.batch_tokens": (1, None), "forcing.chunk_positions": (1, None),
    "forcing.topk": (1, 1000), "forcing.max_rollouts": (1, None),
    "forcing.group_max_rollouts": (1, None),
    "counterfactuals.n": (1, 10000), "counterfactuals.max_points": (1, None),
    "counterfactuals.grid_points": (2, None), "counterfactuals.case_studies": (0, None),
    "counterfactuals.temperature": (0.0, 10.0), "counterfactuals.max_new_tokens": (1, None),
    "counterfactuals.ref_min_pass": (0.0, 1.0), "counterfactuals.caliper": (0.0, None),
    "counterfactuals.batch_rows": (1, None), "counterfactuals.positive_points": (0, None),
    "counterfactuals.placebo_points": (0, None),
    "counterfactuals.continuation_tokens": (1, None),
    "takeover.n_problems": (1, None), "takeover.samples": (1, 1000),
    "takeover.budgets": (0.0001, 0.9999), "takeover.temperature": (0.0, 10.0),
    "takeover.max_new_tokens": (1, None), "takeover.batch_rows": (1, None),
}

# Lists that must hold at least one value, each at most once (an empty list of
# temperatures or groups would leave nothing to sample or force; a repeated one counts twice).
NONEMPTY_UNIQUE = {"rollouts.temperatures", "forcing.groups", "forcing.failure_types",
                   "counterfactuals.point_rule", "takeover.criteria", "takeover.budgets"}
# Lists that may be empty but hold each value at most once (a pair listed twice would be
# forced twice into one table).
UNIQUE = NONEMPTY_UNIQUE | {"forcing.pairs"}

# Suite, model and checkpoint names become folder names: plain names only.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def check_name(name: Any, what: str, where: str = "") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        raise ParamsError(f"{where + ': ' if where else ''}{what} {name!r} is not a plain name "
                          "(letters, digits, '_', '-', '.'; no '/' or '..'): it names folders")
    return name


def _check_list(value: Any, dotted: str, where: str) -> None:
    if dotted not in UNIQUE:
        return
    if not value and dotted in NONEMPTY_UNIQUE:
        raise ParamsError(f"{where}: the list is empty; give at least one value")
    repeated = [v for i, v in enumerate(value) if value.count(v) > 1 and v not in value[:i]]
    if repeated:
        raise ParamsError(f"{where}: {repeated} appear more than once; list each value once")


def _check_range(value: Any, dotted: str, where: str) -> None:
    bounds = RANGES.get(dotted)
    values = list(value.values()) if isinstance(value, dict) else \
        value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            raise ParamsError(f"{where}: {v!r} is not a finite number")
        if bounds is None or v is None:
            continue
        low, high = bounds
        if (low is not None and v < low) or (high is not None and v > high):
            rng = f"[{low}, {high if high is not None else '∞'}]"
            raise ParamsError(f"{where}: {v!r} is outside the allowed range {rng}")


MODEL_KEYS = {
    "hub": {"kind", "id", "revision", "description", "stop_tokens"},
    "local": {"kind", "path", "description", "stop_tokens"},
    "gguf": {"kind", "path", "package", "file", "description", "stop_tokens"},
    "peft": {"kind", "base", "path", "id", "revision", "description", "stop_tokens"},
}
# ``stop_tokens``: the token texts generation stops at (a list, e.g. ['<|im_end|>']). A
# model trained to end its answers with a token must be sampled to stop there; a peft
# model without the key stops where its base does; a model with neither stops at its own
# EOS (generation config and tokenizer).
MODEL_REQUIRED = {"hub": {"id"}, "local": {"path"}, "gguf": set(), "peft": {"base"}}

SECTIONS = {
    "problems": ProblemsParams,
    "grading": GradingParams,
    "filtering": FilteringParams,
    "rollouts": RolloutsParams,
    "forcing": ForcingParams,
    "counterfactuals": CounterfactualsParams,
    "takeover": TakeoverParams,
    "runtime": RuntimeParams,
}
SUITE_KEYS = {"suite", "description", "reference", "target", "prompt_template", "models",
              *SECTIONS}
CHECKPOINT_KEYS = {"step", "model", "run", "description", "forcing", "runtime"}

# The training run a checkpoint belongs to (its file's ``run`` key, default "rlvr"): the RLVR
# run the book studies, or a placebo run (the same optimisation with a reward that carries no
# information, e.g. permuted within each batch), whose checkpoints are the external null of
# chapter 05. A placebo is matched to the RLVR checkpoint of the same step.
RUNS = ("rlvr", "placebo")


def hint(key: str, valid) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_type(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return check_type(value, args[0], where)
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        key_type, value_type = typing.get_args(tp)
        return {check_type(k, key_type, f"{where} (a key)"): check_type(v, value_type, f"{where}[{k!r}]")
                for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ParamsError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp)
        return [check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamsError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ParamsError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{where}: expected true/false, got {value!r}")
        return value
    raise TypeError(f"unsupported parameter type {tp}")


def build_section(cls, raw: Any, source: str, section: str, base=None):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: key '{section}': expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls)]
    values = dataclasses.asdict(base) if base is not None else {}
    for key, value in raw.items():
        if key not in valid:
            raise ParamsError(
                f"{source}: unknown key '{section}.{key}'{hint(key, valid)}; "
                f"valid keys in '{section}': {valid}"
            )
        where = f"{source}: key '{section}.{key}'"
        value = check_type(value, hints[key], where)
        choices = CHOICES.get(f"{section}.{key}")
        for v in value if isinstance(value, (list, dict)) and choices else [value]:  # a mapping's keys
            if choices and v not in choices:
                raise ParamsError(f"{where}: {v!r} is not one of {list(choices)}")
        _check_range(value, f"{section}.{key}", where)
        _check_list(value, f"{section}.{key}", where)
        values[key] = value
    return cls(**values)


def _check_stop_tokens(value: Any, where: str) -> None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ParamsError(f"{where}: expected a non-empty list of token texts, e.g. "
                          f"['<|im_end|>'], got {value!r}")
    if len(set(value)) != len(value):
        raise ParamsError(f"{where}: {value!r} lists a token more than once")


def check_model(name: str, spec: Any, source: str) -> dict:
    where = f"{source}: model '{name}'"
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ParamsError(f"{where}: expected a mapping with 'kind' in {list(MODEL_KEYS)}")
    kind = spec["kind"]
    if kind not in MODEL_KEYS:
        raise ParamsError(f"{where}: key 'kind': {kind!r} is not one of {list(MODEL_KEYS)}")
    for key, value in spec.items():
        if key not in MODEL_KEYS[kind]:
            raise ParamsError(
                f"{where}: unknown key '{key}'{hint(key, MODEL_KEYS[kind])} for kind "
                f"{kind!r}; valid keys: {sorted(MODEL_KEYS[kind])}"
            )
        if key == "stop_tokens":
            _check_stop_tokens(value, f"{where}: key 'stop_tokens'")
        elif not isinstance(value, str):
            raise ParamsError(f"{where}: key '{key}': expected a string, got {value!r}")
    missing = MODEL_REQUIRED[kind] - set(spec)
    if missing:
        raise ParamsError(f"{where}: kind {kind!r} needs keys {sorted(missing)}")
    if kind == "gguf" and not ("path" in spec or {"package", "file"} <= set(spec)):
        raise ParamsError(f"{where}: kind 'gguf' needs 'path', or 'package' and 'file'")
    if kind == "peft" and not ("path" in spec or "id" in spec):
        raise ParamsError(f"{where}: kind 'peft' needs 'path' (a folder) or 'id' (hub)")
    return dict(spec)

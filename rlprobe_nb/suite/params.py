"""Parameters: one YAML per suite and one per checkpoint, validated against a schema.

``params/<suite>/suite.yaml`` holds the suite (models, problems, grading, filtering,
rollouts, forcing, counterfactuals, runtime). Every other ``params/<suite>/<name>.yaml`` is a checkpoint of
the run: its ``step``, its ``model`` and optional overrides of ``forcing``/``runtime``.
Adding a checkpoint is adding a file. Everything is checked before any model is loaded:
an unknown or misspelled key, a wrong type or an unknown checkpoint raises ParamsError
naming the file, the key and the valid choices.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import math
import os
import re
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

from rlprobe_nb.suite import paths
from rlprobe_nb.suite.prompting import DEFAULT_TEMPLATE

DEFAULT_SUITE = "demo"
SUITE_FILE = "suite.yaml"


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
    source: str = "generate"  # generate | prior
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
    seed: int = 0  # of the stratified draw under max_rollouts
    batch_tokens: int = 4096
    chunk_positions: int = 256
    topk: int = 5
    context_policy: str = "skip"  # skip | error
    pairs: list[list[str]] = field(default_factory=list)
    # torch.compile the decoder layers. None: off in the book (distributed.run_pair), so a
    # token table is the same for any number of GPUs; on in direct forcing.run_pair calls
    compile_body: Optional[bool] = None


@dataclass
class CounterfactualsParams:
    # Chapter 08 (rlprobe_nb.counterfactuals): how much is sampled. Every context costs n
    # continuations of up to max_new_tokens minus its prefix, so these cap the cost.
    n: int = 8  # continuations per context (one Wilson interval each)
    max_points: int = 24  # branch points (spikes, else departures) at the checkpoint
    grid_points: int = 8  # takeover-curve prefix lengths per case-study rollout
    case_studies: int = 2  # rollouts that get a whole takeover curve
    temperature: float = 0.7
    max_new_tokens: Optional[int] = None  # whole-response limit; None: the rollouts'
    ref_min_pass: float = 0.1  # the reference continues only problems it solves this often
    caliper: float = 0.25  # controls: largest gap in the reference's entropy (nats)
    batch_rows: int = 32  # rows per generate call (not in any key: rows do not depend on it)
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
    "rollouts.source": ("generate", "prior"),
    # t1_unselected: chapter 04's T = 1 control (forcing.plan), needs 1.0 in the temperatures
    "forcing.groups": ("target", "ref_right", "control", "t1_unselected"),
    "forcing.failure_types": ("correct", "boxed_wrong", "empty_box", "no_box", "truncated",
                              "imported"),
    "forcing.context_policy": ("skip", "error"),
    "runtime.device": ("auto", "cpu", "cuda"),
    "runtime.dtype": ("float32", "bfloat16", "float16"),
    "model.kind": ("hub", "local", "gguf", "peft"),
}

# Allowed ranges (inclusive), checked at load so a bad value fails before any work.
RANGES = {
    "problems.n": (1, None), "problems.limit": (1, None),
    "grading.timeout_s": (0.01, 3600.0), "grading.workers": (1, 256),
    "filtering.n_samples": (0, None), "filtering.temperature": (0.0, 10.0),
    "filtering.max_new_tokens": (1, None), "filtering.batch_size": (1, None),
    "filtering.ref_max_pass": (0.0, 1.0), "filtering.target_min_pass": (0.0, 1.0),
    "filtering.control_ref_min_pass": (0.0, 1.0), "filtering.control_target_max_pass": (0.0, 1.0),
    "rollouts.n_per_problem": (1, None), "rollouts.temperatures": (0.0, 10.0),
    "rollouts.max_new_tokens": (1, None), "rollouts.batch_size": (1, None),
    "forcing.batch_tokens": (1, None), "forcing.chunk_positions": (1, None),
    "forcing.topk": (1, 1000), "forcing.max_rollouts": (1, None),
    "counterfactuals.n": (1, 10000), "counterfactuals.max_points": (1, None),
    "counterfactuals.grid_points": (2, None), "counterfactuals.case_studies": (0, None),
    "counterfactuals.temperature": (0.0, 10.0), "counterfactuals.max_new_tokens": (1, None),
    "counterfactuals.ref_min_pass": (0.0, 1.0), "counterfactuals.caliper": (0.0, None),
    "counterfactuals.batch_rows": (1, None),
}

# Suite, model and checkpoint names become folder names: plain names only.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def check_name(name: Any, what: str, where: str = "") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name) or ".." in name:
        raise ParamsError(f"{where + ': ' if where else ''}{what} {name!r} is not a plain name "
                          "(letters, digits, '_', '-', '.'; no '/' or '..'): it names folders")
    return name


def _check_range(value: Any, dotted: str, where: str) -> None:
    bounds = RANGES.get(dotted)
    values = value if isinstance(value, list) else [value]
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
    "hub": {"kind", "id", "revision", "description"},
    "local": {"kind", "path", "description"},
    "gguf": {"kind", "path", "package", "file", "description"},
    "peft": {"kind", "base", "path", "id", "revision", "description"},
}
MODEL_REQUIRED = {"hub": {"id"}, "local": {"path"}, "gguf": set(), "peft": {"base"}}

SECTIONS = {
    "problems": ProblemsParams,
    "grading": GradingParams,
    "filtering": FilteringParams,
    "rollouts": RolloutsParams,
    "forcing": ForcingParams,
    "counterfactuals": CounterfactualsParams,
    "runtime": RuntimeParams,
}
SUITE_KEYS = {"suite", "description", "reference", "target", "prompt_template", "models",
              *SECTIONS}
CHECKPOINT_KEYS = {"step", "model", "description", "forcing", "runtime"}


@dataclass
class Params:
    suite: str
    description: str
    reference: str
    target: str
    prompt_template: str
    models: dict[str, dict]
    steps: dict[str, int]
    checkpoint: Optional[str]
    problems: ProblemsParams
    grading: GradingParams
    filtering: FilteringParams
    rollouts: RolloutsParams
    forcing: ForcingParams
    counterfactuals: CounterfactualsParams
    runtime: RuntimeParams
    files: list[str]
    overrides: dict[str, Any] = field(default_factory=dict)  # as given to load()

    @property
    def checkpoints(self) -> list[str]:
        """RLVR checkpoints of the run, ordered by training step."""
        return sorted(self.steps, key=lambda name: self.steps[name])

    def model_spec(self, name: str) -> dict:
        if name not in self.models:
            raise ParamsError(
                f"unknown model {name!r} in suite {self.suite!r}; valid: {sorted(self.models)}"
            )
        return self.models[name]

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["checkpoints"] = self.checkpoints
        return out


def _hint(key: str, valid) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_type(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _check_type(value, args[0], where)
    if origin is list:
        if not isinstance(value, list):
            raise ParamsError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        (item,) = typing.get_args(tp)
        return [_check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
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


def _build_section(cls, raw: Any, source: str, section: str, base=None):
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
                f"{source}: unknown key '{section}.{key}'{_hint(key, valid)}; "
                f"valid keys in '{section}': {valid}"
            )
        where = f"{source}: key '{section}.{key}'"
        value = _check_type(value, hints[key], where)
        choices = CHOICES.get(f"{section}.{key}")
        for v in value if isinstance(value, list) and choices else [value]:
            if choices and v not in choices:
                raise ParamsError(f"{where}: {v!r} is not one of {list(choices)}")
        _check_range(value, f"{section}.{key}", where)
        values[key] = value
    return cls(**values)


def _check_model(name: str, spec: Any, source: str) -> dict:
    where = f"{source}: model '{name}'"
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ParamsError(f"{where}: expected a mapping with 'kind' in {list(MODEL_KEYS)}")
    kind = spec["kind"]
    if kind not in MODEL_KEYS:
        raise ParamsError(f"{where}: key 'kind': {kind!r} is not one of {list(MODEL_KEYS)}")
    for key, value in spec.items():
        if key not in MODEL_KEYS[kind]:
            raise ParamsError(
                f"{where}: unknown key '{key}'{_hint(key, MODEL_KEYS[kind])} for kind "
                f"{kind!r}; valid keys: {sorted(MODEL_KEYS[kind])}"
            )
        if not isinstance(value, str):
            raise ParamsError(f"{where}: key '{key}': expected a string, got {value!r}")
    missing = MODEL_REQUIRED[kind] - set(spec)
    if missing:
        raise ParamsError(f"{where}: kind {kind!r} needs keys {sorted(missing)}")
    if kind == "gguf" and not ("path" in spec or {"package", "file"} <= set(spec)):
        raise ParamsError(f"{where}: kind 'gguf' needs 'path', or 'package' and 'file'")
    if kind == "peft" and not ("path" in spec or "id" in spec):
        raise ParamsError(f"{where}: kind 'peft' needs 'path' (a folder) or 'id' (hub)")
    return dict(spec)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key repeated in one mapping (plain YAML keeps the
    last one silently: a repeated ``forcing:`` section would drop the first)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ParamsError(f"{self.name}: key {key!r} appears twice, on lines "
                                  f"{seen[key]} and {line}; keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> dict:
    try:
        loader = _UniqueKeyLoader(path.read_text(encoding="utf-8"))
        loader.name = str(path)
        try:
            raw = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return raw


def _check_keys(raw: dict, valid: set[str], source: Path) -> None:
    for key in raw:
        if key not in valid:
            raise ParamsError(
                f"{source}: unknown key '{key}'{_hint(key, valid)}; valid keys: {sorted(valid)}"
            )


def available_suites() -> list[str]:
    return sorted(p.parent.name for p in paths.params_dir().glob(f"*/{SUITE_FILE}"))


def active_suite(suite: Optional[str] = None) -> str:
    """The suite named, else $RLPROBE_SUITE, else the demo suite."""
    return suite or os.environ.get("RLPROBE_SUITE") or DEFAULT_SUITE


def _load_checkpoints(folder: Path, models: dict, suite_file: Path) -> tuple[dict, dict]:
    """Every <checkpoint>.yaml of the suite: steps by name, raw contents by name (their
    models are added to ``models``)."""
    steps: dict[str, int] = {}
    ckpt_raw: dict[str, dict] = {}
    for f in sorted(folder.glob("*.yaml")):
        if f.name == SUITE_FILE:
            continue
        name = check_name(f.stem, "checkpoint", str(f))
        data = _read_yaml(f)
        _check_keys(data, CHECKPOINT_KEYS, f)
        if name in models:
            raise ParamsError(f"{f}: checkpoint {name!r} is also a model in {suite_file}")
        if "model" not in data or "step" not in data:
            raise ParamsError(f"{f}: a checkpoint file needs 'step' and 'model'")
        steps[name] = _check_type(data["step"], int, f"{f}: key 'step'")
        models[name] = _check_model(name, data["model"], str(f))
        ckpt_raw[name] = data
    return steps, ckpt_raw


def _apply_overrides(raw: dict, sections: dict, applied: dict) -> dict:
    """Apply notebook overrides to the sections (in place) and the roles; returns raw."""
    for dotted, value in applied.items():
        if dotted in ("target", "reference"):
            raw = {**raw, dotted: value}
            continue
        section, _, key = dotted.partition(".")
        if section not in SECTIONS or not key:
            raise ParamsError(
                f"override {dotted!r}: expected 'section.key' with section in {list(SECTIONS)}"
            )
        sections[section] = _build_section(
            SECTIONS[section], {key: value}, "override", section, sections[section]
        )
    return raw


def load(suite: Optional[str] = None, checkpoint: Optional[str] = None,
         overrides: Optional[dict[str, Any]] = None) -> Params:
    """Load and validate a suite's parameters (and one checkpoint's, when named).

    ``overrides`` maps dotted keys to values (``{"forcing.batch_tokens": 2048}``, or
    ``"target"``/``"reference"`` for the roles); ``None`` values are ignored so notebook
    parameters can default to "use the YAML". The applied ones are kept in
    ``Params.overrides`` (manifests record them, so a later check of a table's currency
    rebuilds its inputs with the same overrides).
    """
    suite = check_name(active_suite(suite), "suite")
    folder = paths.suite_params_dir(suite)
    suite_file = folder / SUITE_FILE
    if not suite_file.exists():
        raise ParamsError(
            f"suite {suite!r}: no {suite_file}; valid suites: {available_suites()}"
        )
    raw = _read_yaml(suite_file)
    _check_keys(raw, SUITE_KEYS, suite_file)
    if raw.get("suite", suite) != suite:
        raise ParamsError(f"{suite_file}: key 'suite': {raw['suite']!r} != folder name {suite!r}")
    models_raw = raw.get("models") or {}
    if not isinstance(models_raw, dict):
        raise ParamsError(f"{suite_file}: key 'models': expected a mapping of name -> model")
    models = {check_name(name, "model", str(suite_file)): _check_model(name, spec, str(suite_file))
              for name, spec in models_raw.items()}

    steps, ckpt_raw = _load_checkpoints(folder, models, suite_file)
    if checkpoint is not None and checkpoint not in steps:
        raise ParamsError(
            f"checkpoint {checkpoint!r}: no {folder / (str(checkpoint) + '.yaml')}; "
            f"valid checkpoints of suite {suite!r}: {sorted(steps, key=steps.get)}"
            f"{_hint(str(checkpoint), steps)}"
        )
    for name, spec in models.items():
        if spec["kind"] == "peft" and spec["base"] not in models:
            raise ParamsError(
                f"model {name!r}: base {spec['base']!r} is not a model of suite {suite!r}; "
                f"valid: {sorted(models)}"
            )

    sections = {
        name: _build_section(cls, raw.get(name), str(suite_file), name)
        for name, cls in SECTIONS.items()
    }
    files = [str(suite_file)]
    if checkpoint is not None:
        ck_file = folder / f"{checkpoint}.yaml"
        files.append(str(ck_file))
        for name in ("forcing", "runtime"):
            if name in ckpt_raw[checkpoint]:
                sections[name] = _build_section(
                    SECTIONS[name], ckpt_raw[checkpoint][name], str(ck_file), name, sections[name]
                )
    applied = {k: v for k, v in (overrides or {}).items() if v is not None}
    raw = _apply_overrides(raw, sections, applied)

    for role in ("reference", "target"):
        name = raw.get(role)
        if not isinstance(name, str) or name not in models:
            raise ParamsError(
                f"{suite_file}: key '{role}': {name!r} is not a model of the suite; "
                f"valid: {sorted(models)}"
            )
    for i, pair in enumerate(sections["forcing"].pairs):
        bad = [m for m in pair if m not in models]
        if len(pair) != 2 or bad:
            raise ParamsError(
                f"{suite_file}: key 'forcing.pairs[{i}]': expected [checkpoint, reference] "
                f"of known models, got {pair}; valid models: {sorted(models)}"
            )
    template = raw.get("prompt_template", DEFAULT_TEMPLATE)
    if not isinstance(template, str) or "{problem}" not in template:
        raise ParamsError(f"{suite_file}: key 'prompt_template' must be a string with '{{problem}}'")
    return Params(
        suite=suite,
        description=str(raw.get("description", "")),
        reference=raw["reference"],
        target=raw["target"],
        prompt_template=template,
        models=models,
        steps=steps,
        checkpoint=checkpoint,
        files=files,
        overrides=applied,
        **sections,
    )


def check_notebook_parameters(history: list[str], declared: list[str]) -> None:
    """Fail on parameters papermill injected that the notebook does not declare.

    papermill only warns about unknown ``-p`` names; a typo would then silently run with
    the default. The injected cell is found in the kernel's input history (``In``) by its
    ``# Parameters`` header and read with ``ast`` (never executed here).
    """
    for source in history:
        if not source.lstrip().startswith("# Parameters"):
            continue
        names = []
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        unknown = [n for n in names if n not in declared]
        if unknown:
            raise ParamsError(
                f"unknown notebook parameter(s) {unknown}{_hint(unknown[0], declared)}; "
                f"this notebook takes: {declared}"
            )

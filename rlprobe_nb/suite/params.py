"""Parameters: one YAML per suite and one per checkpoint, validated against a schema.

``params/<suite>/suite.yaml`` holds the suite (models, problems, grading, filtering,
rollouts, forcing, counterfactuals, runtime). Every other ``params/<suite>/<name>.yaml`` is a checkpoint of
the run: its ``step``, its ``model`` and optional overrides of ``forcing``/``runtime``.
Adding a checkpoint is adding a file. A checkpoint file may say ``run: placebo``: a
checkpoint of a placebo run (the same training with a reward that carries no information),
forced like any checkpoint and matched to the RLVR checkpoint of the same step
(``Params.placebo_for``); ``Params.checkpoints`` stays the RLVR run. A placebo step that no
RLVR checkpoint has is refused. Everything is checked before any model is loaded:
an unknown or misspelled key, a wrong type or an unknown checkpoint raises ParamsError
naming the file, the key and the valid choices (the schema: ``param_schema``).

The files are read once per ``load``; ``variant`` gives the same suite for another
checkpoint or other overrides from what was read, without reading the files again (so
a notebook checking the tables it reads sees the suite as it loaded it, once).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from rlprobe_nb.suite import paths
from rlprobe_nb.suite.notebook_parameters import check_notebook_parameters  # noqa: F401
from rlprobe_nb.suite.param_schema import (  # noqa: F401 (the schema is read through here too)
    CHECKPOINT_KEYS,
    CHOICES,
    RUNS,
    MODEL_KEYS,
    RANGES,
    SECTIONS,
    SUITE_KEYS,
    CounterfactualsParams,
    FilteringParams,
    ForcingParams,
    GradingParams,
    ParamsError,
    ProblemsParams,
    RolloutsParams,
    RuntimeParams,
    TakeoverParams,
    build_section,
    check_model,
    check_name,
    check_type,
    hint,
)
from rlprobe_nb.suite.prompting import DEFAULT_TEMPLATE

DEFAULT_SUITE = "demo"
SUITE_FILE = "suite.yaml"


@dataclass(frozen=True)
class SuiteFiles:
    """A suite's parameter files as read: the suite file's mapping, its models, and each
    checkpoint's step and mapping."""

    suite: str
    folder: Path
    raw: dict
    models: dict[str, dict]
    steps: dict[str, int]
    checkpoints: dict[str, dict]
    runs: dict[str, str] = field(default_factory=dict)  # checkpoint -> its run (RUNS)

    @property
    def suite_file(self) -> Path:
        return self.folder / SUITE_FILE


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
    takeover: TakeoverParams
    runtime: RuntimeParams
    files: list[str]
    overrides: dict[str, Any] = field(default_factory=dict)  # as given to load()
    # checkpoint -> the run it belongs to, "rlvr" or "placebo" (absent: "rlvr")
    runs: dict[str, str] = field(default_factory=dict)
    # the files these were built from (``variant`` builds others from them); not a value
    source: Optional[SuiteFiles] = field(default=None, repr=False, compare=False)

    def run_of(self, name: str) -> str:
        """The run a checkpoint belongs to: "rlvr" or "placebo"."""
        return self.runs.get(name, "rlvr")

    def _of_run(self, run: str) -> list[str]:
        return sorted((n for n in self.steps if self.run_of(n) == run),
                      key=lambda name: self.steps[name])

    @property
    def checkpoints(self) -> list[str]:
        """RLVR checkpoints of the run, ordered by training step."""
        return self._of_run("rlvr")

    @property
    def placebos(self) -> list[str]:
        """Placebo checkpoints (the external null), ordered by training step."""
        return self._of_run("placebo")

    @property
    def forced(self) -> list[str]:
        """Every checkpoint notebook 03 forces: the RLVR run, then the placebos."""
        return self.checkpoints + self.placebos

    def placebo_for(self, checkpoint: str) -> Optional[str]:
        """The placebo checkpoint at the step of an RLVR ``checkpoint``, or None."""
        if checkpoint not in self.steps or self.run_of(checkpoint) != "rlvr":
            raise ParamsError(f"{checkpoint!r} is not an RLVR checkpoint of suite "
                              f"{self.suite!r}; valid: {self.checkpoints}")
        same = [p for p in self.placebos if self.steps[p] == self.steps[checkpoint]]
        return same[0] if same else None

    def model_spec(self, name: str) -> dict:
        if name not in self.models:
            raise ParamsError(
                f"unknown model {name!r} in suite {self.suite!r}; valid: {sorted(self.models)}"
            )
        return self.models[name]

    def as_dict(self) -> dict:
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)
               if f.name != "source"}
        out = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
               for k, v in out.items()}
        out["checkpoints"] = self.checkpoints
        if self.placebos:
            out["placebos"] = self.placebos
        return out


# Bounds on a parameter file: a suite file is a few kB. A larger file, deeper nesting or
# more aliases than this is refused naming the file (an alias bomb of 4 kB expands to
# gigabytes once anything walks it, a 50 MB list takes minutes to parse).
MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_ALIASES = 64
MAX_YAML_NODES = 100_000  # counted with every alias expanded


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key repeated in one mapping (plain YAML keeps the
    last one silently: a repeated ``forcing:`` section would drop the first), and nesting
    or aliases beyond the bounds above."""

    depth = 0
    aliases = 0

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise ParamsError(f"{self.name}, line {mark.line + 1}: more than "
                                  f"{MAX_YAML_ALIASES} aliases (*name); write the values out")
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                raise ParamsError(f"{self.name}, line {mark.line + 1}: nested more than "
                                  f"{MAX_YAML_DEPTH} levels deep; a parameter file is a few "
                                  "flat sections")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

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


def _expanded_nodes(node, memo: dict) -> int:
    """How many nodes a YAML node stands for with every alias expanded."""
    if id(node) not in memo:
        memo[id(node)] = 1  # a cycle counts once here; the depth bound ends it
        children = node.value if isinstance(node.value, list) else []
        total = 1
        for child in children:
            for n in (child if isinstance(child, tuple) else (child,)):
                total += _expanded_nodes(n, memo)
        memo[id(node)] = total
    return memo[id(node)]


def _yaml_text(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise ParamsError(f"{path}: {size:,} bytes, more than a parameter file may hold "
                          f"({MAX_YAML_BYTES:,}); is it the right file?")
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ParamsError(f"{path}, line {line}: byte {data[exc.start]:#04x} is not UTF-8; "
                          "save the file as UTF-8") from exc


def _read_yaml(path: Path) -> dict:
    text = _yaml_text(path)
    try:
        loader = _UniqueKeyLoader(text)
        loader.name = str(path)
        try:
            node = loader.get_single_node()
            if node is not None and _expanded_nodes(node, {}) > MAX_YAML_NODES:
                raise ParamsError(f"{path}: its aliases expand to more than {MAX_YAML_NODES:,} "
                                  "values; write the values out")
            raw = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ParamsError(f"{path}: nested too deeply to read") from exc
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return raw


def _check_keys(raw: dict, valid: set[str], source: Path) -> None:
    for key in raw:
        if key not in valid:
            raise ParamsError(
                f"{source}: unknown key '{key}'{hint(key, valid)}; valid keys: {sorted(valid)}"
            )


def available_suites() -> list[str]:
    return sorted(p.parent.name for p in paths.params_dir().glob(f"*/{SUITE_FILE}"))


def active_suite(suite: Optional[str] = None) -> str:
    """The suite named, else $RLPROBE_SUITE, else the demo suite."""
    return suite or os.environ.get("RLPROBE_SUITE") or DEFAULT_SUITE


def _load_checkpoints(folder: Path, models: dict, suite_file: Path) -> tuple[dict, dict, dict]:
    """Every <checkpoint>.yaml of the suite: steps by name, raw contents by name, runs by
    name (their models are added to ``models``)."""
    steps: dict[str, int] = {}
    ckpt_raw: dict[str, dict] = {}
    runs: dict[str, str] = {}
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
        steps[name] = check_type(data["step"], int, f"{f}: key 'step'")
        if steps[name] < 0:
            raise ParamsError(f"{f}: key 'step': {steps[name]} is negative; a checkpoint's "
                              "step counts RL updates from 0")
        runs[name] = check_type(data.get("run", "rlvr"), str, f"{f}: key 'run'")
        if runs[name] not in RUNS:
            raise ParamsError(f"{f}: key 'run': {runs[name]!r} is not one of {list(RUNS)} "
                              "(rlvr: the run the book studies, the default; placebo: the same "
                              f"training with an uninformative reward){hint(runs[name], RUNS)}")
        models[name] = check_model(name, data["model"], str(f))
        ckpt_raw[name] = data
    for run in RUNS:
        _check_steps_distinct({n: s for n, s in steps.items() if runs[n] == run}, folder)
    _check_placebo_steps(steps, runs, folder)
    return steps, ckpt_raw, runs


def _check_steps_distinct(steps: dict[str, int], folder: Path) -> None:
    by_step: dict[int, list[str]] = {}
    for name, step in steps.items():
        by_step.setdefault(step, []).append(name)
    shared = {step: names for step, names in by_step.items() if len(names) > 1}
    if shared:
        step, names = sorted(shared.items())[0]
        raise ParamsError(f"{folder}: checkpoints {sorted(names)} share step {step}; each "
                          "checkpoint of a run has its own step (charts and tests order them "
                          "by it)")


def _check_placebo_steps(steps: dict[str, int], runs: dict[str, str], folder: Path) -> None:
    """Every placebo checkpoint has an RLVR checkpoint at its step (it is that one's null)."""
    rlvr = {s: n for n, s in steps.items() if runs[n] == "rlvr"}
    for name, step in sorted(steps.items()):
        if runs[name] == "placebo" and step not in rlvr:
            raise ParamsError(
                f"{folder / (name + '.yaml')}: placebo checkpoint {name!r} is at step {step}, "
                f"where the RLVR run has no checkpoint (its steps: {sorted(rlvr)}); a placebo is "
                "the null of the RLVR checkpoint at the same step: add that checkpoint or "
                "remove this file")


def read_files(suite: Optional[str] = None) -> SuiteFiles:
    """Read and check a suite's parameter files (the suite file, every checkpoint file)."""
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
    models = {check_name(name, "model", str(suite_file)): check_model(name, spec, str(suite_file))
              for name, spec in models_raw.items()}
    steps, ckpt_raw, runs = _load_checkpoints(folder, models, suite_file)
    for name, spec in models.items():
        if spec["kind"] == "peft" and spec["base"] not in models:
            raise ParamsError(
                f"model {name!r}: base {spec['base']!r} is not a model of suite {suite!r}; "
                f"valid: {sorted(models)}"
            )
    _check_no_base_cycle(models, suite_file)
    return SuiteFiles(suite, folder, raw, models, steps, ckpt_raw, runs)


def _check_no_base_cycle(models: dict, suite_file: Path) -> None:
    """A peft model's chain of bases ends at a model that is not an adapter."""
    for name in models:
        chain = [name]
        while models[chain[-1]]["kind"] == "peft":
            base = models[chain[-1]]["base"]
            if base in chain:
                loop = " -> ".join(chain[chain.index(base):] + [base])
                raise ParamsError(f"{suite_file}: the peft models' bases form a cycle ({loop}); "
                                  "an adapter's base must lead to a model of another kind")
            chain.append(base)


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
        sections[section] = build_section(
            SECTIONS[section], {key: value}, "override", section, sections[section]
        )
    return raw


def _sections(files: SuiteFiles, checkpoint: Optional[str]) -> tuple[dict, list[str]]:
    """Every section from the suite file, with the checkpoint file's own sections over them."""
    sections = {name: build_section(cls, files.raw.get(name), str(files.suite_file), name)
                for name, cls in SECTIONS.items()}
    used = [str(files.suite_file)]
    if checkpoint is not None:
        if checkpoint not in files.steps:
            raise ParamsError(
                f"checkpoint {checkpoint!r}: no {files.folder / (str(checkpoint) + '.yaml')}; "
                f"valid checkpoints of suite {files.suite!r}: "
                f"{sorted(files.steps, key=files.steps.get)}{hint(str(checkpoint), files.steps)}")
        ck_file = files.folder / f"{checkpoint}.yaml"
        used.append(str(ck_file))
        for name in ("forcing", "runtime"):
            if name in files.checkpoints[checkpoint]:
                sections[name] = build_section(SECTIONS[name], files.checkpoints[checkpoint][name],
                                               str(ck_file), name, sections[name])
    return sections, used


def _check_roles_and_pairs(raw: dict, sections: dict, models: dict, suite_file: Path) -> str:
    """The roles name models of the suite, two different ones; every pair names two
    different models. Returns the prompt template."""
    for role in ("reference", "target"):
        name = raw.get(role)
        if not isinstance(name, str) or name not in models:
            raise ParamsError(f"{suite_file}: key '{role}': {name!r} is not a model of the "
                              f"suite; valid: {sorted(models)}")
    if raw["reference"] == raw["target"]:
        raise ParamsError(f"{suite_file}: 'reference' and 'target' are both {raw['target']!r}; "
                          "the target is the model the reference is compared with: name another")
    for i, pair in enumerate(sections["forcing"].pairs):
        bad = [m for m in pair if m not in models]
        if len(pair) != 2 or bad or pair[0] == pair[1]:
            raise ParamsError(
                f"{suite_file}: key 'forcing.pairs[{i}]': expected [checkpoint, reference], two "
                f"different models of the suite, got {pair}; valid models: {sorted(models)}")
    template = raw.get("prompt_template", DEFAULT_TEMPLATE)
    if not isinstance(template, str) or "{problem}" not in template:
        raise ParamsError(f"{suite_file}: key 'prompt_template' must be a string with '{{problem}}'")
    return template


def build(files: SuiteFiles, checkpoint: Optional[str] = None,
          overrides: Optional[dict[str, Any]] = None) -> Params:
    """The parameters of a suite read by ``read_files``, for one checkpoint (or none) with
    notebook overrides applied (``None`` values ignored)."""
    sections, used = _sections(files, checkpoint)
    applied = {k: v for k, v in (overrides or {}).items() if v is not None}
    raw = _apply_overrides(files.raw, sections, applied)
    template = _check_roles_and_pairs(raw, sections, files.models, files.suite_file)
    if files.runs.get(raw["target"]) == "placebo":
        raise ParamsError(f"{files.suite_file}: key 'target': {raw['target']!r} is a placebo "
                          "checkpoint; the target is a checkpoint of the RLVR run")
    return Params(suite=files.suite, description=str(raw.get("description", "")),
                  reference=raw["reference"], target=raw["target"], prompt_template=template,
                  models=files.models, steps=files.steps, checkpoint=checkpoint, files=used,
                  overrides=applied, runs=dict(files.runs), source=files, **sections)


def load(suite: Optional[str] = None, checkpoint: Optional[str] = None,
         overrides: Optional[dict[str, Any]] = None) -> Params:
    """Load and validate a suite's parameters (and one checkpoint's, when named).

    ``overrides`` maps dotted keys to values (``{"forcing.batch_tokens": 2048}``, or
    ``"target"``/``"reference"`` for the roles); ``None`` values are ignored so notebook
    parameters can default to "use the YAML". The applied ones are kept in
    ``Params.overrides`` (manifests record them, so a later check of a table's currency
    rebuilds its inputs with the same overrides, through ``variant``).
    """
    return build(read_files(suite), checkpoint, overrides)


def variant(P: Params, checkpoint: Optional[str], overrides: Optional[dict[str, Any]]) -> Params:
    """The suite as ``P`` read it, for another checkpoint and other overrides (no file is
    read again)."""
    new = load(P.suite, checkpoint, overrides) if P.source is None \
        else build(P.source, checkpoint, overrides)
    for name, value in P.__dict__.items():  # what the loaded suite remembered (model
        if name.startswith("_"):              # identities, checked tables) holds for it too
            new.__dict__[name] = value
    return new

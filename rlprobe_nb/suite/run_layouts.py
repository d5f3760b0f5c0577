"""How RL trainers lay out a run folder: detection by content and one ``Found`` per
checkpoint (its step, where the step came from, what its weights are), for ``discover``.

Layouts (read from the trainers' own code, see README "Bring your own run"):
  verl           global_step_N/actor/ with model_world_size_W_rank_R.pt (FSDP shards) and
                 huggingface/ (config, tokenizer, weights only with hf_model), or Megatron
                 (ckpt_contents.json, model/huggingface/ or model/dist_ckpt/)
  trl            checkpoint-N/ with trainer_state.json; weights: model*.safetensors,
                 adapter_model.safetensors, pytorch_model_fsdp_0/ (DCP) or a ZeRO-3 state
  openrlhf       global_stepN_hf/ (HF folders) and _actor/global_stepN/ (DeepSpeed state)
  open-instruct  step_N/ HF folders, finished when .checkpoint_complete is there
  nemo-rl        step_N/ with training_info.json, config.yaml, policy/weights (DCP)
Nothing here loads weights or imports a trainer; an incomplete save is skipped with its
reason, an unsupported one is kept with ``refuse`` (the cause and the command to run).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

FRAMEWORKS = ("verl", "trl", "openrlhf", "open-instruct", "nemo-rl")
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
              "pytorch_model.bin.index.json")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")


class DiscoverError(ValueError):
    """A run folder cannot become a suite as asked; the message names the folder, what is
    missing and the command to run instead."""


@dataclass
class Found:
    """One checkpoint of a run as found on disk (no weights loaded)."""

    step: int
    step_source: str
    folder: Path
    weights: str  # hf | peft | peft_bin | fsdp_shards | ds_zero12 | dcp | hub | refused
    config_dir: Optional[Path] = None  # where config.json is (None: the reference's)
    tokenizer_dir: Optional[Path] = None  # where the tokenizer is (None: the reference's)
    notes: list[str] = field(default_factory=list)
    refuse: Optional[str] = None  # why it cannot be used, with the command to run
    extra: dict = field(default_factory=dict)

    def as_record(self) -> dict:
        return {"step": self.step, "step_source": self.step_source, "folder": str(self.folder),
                "weights": self.weights, "config_dir": _s(self.config_dir),
                "tokenizer_dir": _s(self.tokenizer_dir), "notes": self.notes,
                "refuse": self.refuse, **{k: _s(v) for k, v in self.extra.items()}}


def _s(v):
    return str(v) if isinstance(v, Path) else v


@dataclass
class Skipped:
    folder: Path
    why: str


def _numbered(parent: Path, pattern: str) -> list[tuple[int, Path]]:
    rx = re.compile(pattern)
    out = []
    for p in sorted(parent.iterdir()) if parent.is_dir() else []:
        m = rx.fullmatch(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                  "tokenizer.model"))


def _hf_kind(folder: Path) -> Optional[str]:
    """hf / peft / peft_bin for a folder a framework saved with save_pretrained, else None."""
    if (folder / "adapter_model.safetensors").is_file():
        return "peft"
    if (folder / "adapter_model.bin").is_file():
        return "peft_bin"
    if (folder / "config.json").is_file() and (
            any((folder / f).is_file() for f in HF_WEIGHTS)
            or any(folder.glob("model-*-of-*.safetensors"))):
        return "hf"
    return None


def hf_found(step: int, source: str, folder: Path) -> Found:
    kind = _hf_kind(folder)
    if kind is None:
        return Found(step, source, folder, "refused", refuse=(
            f"{folder}: no weights (neither config.json with model*.safetensors / "
            "pytorch_model*.bin nor adapter_model.*). Save the model with save_pretrained "
            "there, or point discover at a folder that has them with --framework folders"))
    return Found(step, source, folder, kind, config_dir=folder if kind == "hf" else None,
                 tokenizer_dir=folder if _has_tokenizer(folder) else None)


# ---------------------------------------------------------------- detection


def detect(run: Path) -> dict[str, list[str]]:
    """Evidence per framework: what was seen that only that framework writes."""
    seen: dict[str, list[str]] = {f: [] for f in FRAMEWORKS}
    for step, d in _numbered(run, r"global_step_(\d+)"):
        if (d / "actor").is_dir():
            seen["verl"].append(f"{d.name}/actor/")
    for step, d in _numbered(run, r"checkpoint-(\d+)"):
        if (d / "trainer_state.json").is_file():
            seen["trl"].append(f"{d.name}/trainer_state.json")
    if (run / "_actor" / "latest").is_file():
        seen["openrlhf"].append("_actor/latest")
    seen["openrlhf"] += [f"{d.name}/" for _, d in _numbered(run, r"global_step(\d+)_hf")]
    parents = [run] + sorted(p for p in run.glob("*_checkpoints") if p.is_dir())
    for _, d in [x for parent in parents for x in _numbered(parent, r"step_(\d+)")]:
        if (d / "training_info.json").is_file() and (d / "config.yaml").is_file():
            seen["nemo-rl"].append(f"{d.name}/training_info.json")
        elif (d / ".checkpoint_complete").is_file() or _hf_kind(d):
            seen["open-instruct"].append(f"{d.name}/")
    return {k: v for k, v in seen.items() if v}


RULES = {
    "verl": "global_step_N/actor/",
    "trl": "checkpoint-N/trainer_state.json",
    "openrlhf": "_actor/latest or global_stepN_hf/",
    "open-instruct": "step_N/ with .checkpoint_complete or HF weights",
    "nemo-rl": "step_N/training_info.json + config.yaml",
}


def choose_framework(run: Path, asked: str) -> str:
    if not run.is_dir():
        raise DiscoverError(f"{run}: not a folder; give the run's output folder")
    if asked != "auto":
        return asked
    seen = detect(run)
    if len(seen) == 1:
        return next(iter(seen))
    rules = "; ".join(f"{f}: {RULES[f]}" for f in FRAMEWORKS)
    if not seen:
        raise DiscoverError(f"{run}: no known layout (looked for {rules}). Pass --framework "
                            "folders for a folder of HF model folders named by their step")
    raise DiscoverError(f"{run}: several layouts match ({seen}); pass --framework with one of "
                        f"{sorted(seen)}")


# ---------------------------------------------------------------- enumeration


def enumerate_run(run: Path, framework: str) -> tuple[list[Found], list[Skipped]]:
    from rlprobe_nb.suite import trainer_layouts as more

    readers = {"verl": more.verl, "trl": more.trl, "openrlhf": more.openrlhf,
               "open-instruct": more.open_instruct, "nemo-rl": more.nemo_rl,
               "folders": folders}
    if framework not in readers:
        raise DiscoverError(f"--framework {framework!r}: not one of {sorted(readers)}")
    found, skipped = readers[framework](run)
    return sorted(found, key=lambda f: f.step), skipped


def folders(run: Path, step_regex: str = r"\D*(\d+)\D*") -> tuple[list[Found], list[Skipped]]:
    """Any folder of HF model folders, the step read from the number in each name."""
    found, skipped = [], []
    for step, d in _numbered(run, step_regex):
        f = hf_found(step, f"folder name {d.name}", d)
        (found.append(f) if f.weights != "refused" else skipped.append(Skipped(d, f.refuse)))
    return found, skipped


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DiscoverError(f"{path}: cannot be read as JSON ({exc}); is the save complete?")

"""One reader per trainer layout: a run folder -> (checkpoints found, incomplete saves
skipped with why). The layouts are described in ``run_layouts``; nothing is loaded here
but small JSON/YAML records."""

from __future__ import annotations

import re
from pathlib import Path

from rlprobe_nb.suite.run_layouts import (Found, Skipped, _has_tokenizer, _hf_kind, _numbered,
                                          hf_found, read_json)

SHARD_RE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")


def _zero3(step: int, source: str, folder: Path, ds_dir: Path, tag: str) -> Found:
    """A DeepSpeed ZeRO-3 state: the weights are only in partitioned optimizer groups."""
    script = ds_dir / "zero_to_fp32.py"
    return Found(step, source, folder, "refused", refuse=(
        f"{ds_dir / tag}: DeepSpeed ZeRO-3 state (zero_pp_rank_*_model_states.pt, no "
        "mp_rank_00_model_states.pt): the weights are partitioned across the optimizer "
        "states and only DeepSpeed rebuilds them. In your training environment run: "
        f"python {script} {ds_dir} OUT/{tag} --tag {tag} --safe_serialization ; then copy "
        "config.json and the tokenizer beside it and run discover on OUT with --framework "
        "folders"))


def _deepspeed(step: int, source: str, folder: Path, ds_dir: Path, tag: str) -> Found | None:
    """ZeRO-1/2 (``mp_rank_00_model_states.pt`` holds the module's state dict) or ZeRO-3."""
    d = ds_dir / tag
    if (d / "mp_rank_00_model_states.pt").is_file():
        return Found(step, source, folder, "ds_zero12",
                     extra={"states": d / "mp_rank_00_model_states.pt"})
    if any(d.glob("zero_pp_rank_*_mp_rank_*_model_states.pt")):
        return _zero3(step, source, folder, ds_dir, tag)
    return None


def verl(run: Path):
    found, skipped = [], []
    for step, d in _numbered(run, r"global_step_(\d+)"):
        actor, source = d / "actor", f"folder name {d.name}"
        if not actor.is_dir():
            skipped.append(Skipped(d, "no actor/ folder (only the critic or the dataloader "
                                      "state was saved)"))
            continue
        if (actor / "ckpt_contents.json").is_file() or (actor / "model").is_dir() \
                or (actor / "dist_ckpt").is_dir():
            _verl_megatron(step, source, actor, found, skipped)
        else:
            _verl_fsdp(step, source, actor, found)
    return found, skipped


def _verl_megatron(step, source, actor: Path, found, skipped) -> None:
    contents = actor / "ckpt_contents.json"
    if (actor / "model").is_dir() and not contents.is_file():
        skipped.append(Skipped(actor, "Megatron save without ckpt_contents.json (verl writes "
                                      "it last: the save did not finish)"))
        return
    if contents.is_file():
        recorded = read_json(contents).get("global_step")
        if recorded is not None and int(recorded) != step:
            found.append(Found(step, source, actor, "refused", refuse=(
                f"{contents}: global_step {recorded}, but the folder says {step}; rename the "
                f"folder to global_step_{recorded} or leave it out with --steps")))
            return
        source += f" = ckpt_contents.json global_step {recorded}"
    for hf in (actor / "model" / "huggingface", actor / "huggingface"):
        if _hf_kind(hf / "adapter") == "peft":
            f = hf_found(step, source, hf / "adapter")
            f.tokenizer_dir = hf if _has_tokenizer(hf) else None
            found.append(f)
            return
        if _hf_kind(hf) == "hf":
            found.append(hf_found(step, source, hf))
            return
    found.append(Found(step, source, actor, "refused", refuse=(
        f"{actor}: Megatron dist_ckpt only (no HF weights in model/huggingface/); it needs "
        "Megatron-Core to read. Convert with: python -m verl.model_merger merge --backend "
        f"megatron --local_dir {actor} --target_dir OUT/global_step_{step} ; then run "
        "discover on OUT with --framework folders")))


def _verl_fsdp(step: int, source: str, actor: Path, found: list) -> None:
    hf = actor / "huggingface"
    if _hf_kind(hf) == "hf":  # saved with checkpoint.save_contents: [hf_model]
        f = hf_found(step, source, hf)
        f.notes.append("full weights in huggingface/ (hf_model): used as they are")
        found.append(f)
        return
    shards = {}
    for p in actor.iterdir():
        m = SHARD_RE.fullmatch(p.name)
        if m:
            shards.setdefault(int(m.group(1)), {})[int(m.group(2))] = p
    config = actor / "fsdp_config.json"
    meta = read_json(config) if config.is_file() else {}
    if not shards:
        found.append(Found(step, source, actor, "refused", refuse=(
            f"{actor}: no model_world_size_*_rank_*.pt shard files and no weights in "
            "huggingface/; was the model saved (checkpoint.save_contents)? Re-save, or leave "
            "this step out with --steps")))
        return
    world = int(meta.get("world_size", max(shards)))
    have = shards.get(world, {})
    missing = [f"model_world_size_{world}_rank_{r}.pt" for r in range(world) if r not in have]
    f = Found(step, source, actor, "fsdp_shards", config_dir=hf if (hf / "config.json").is_file()
              else None, tokenizer_dir=hf if _has_tokenizer(hf) else None,
              extra={"world_size": world, "fsdp_version": meta.get("FSDP_version"),
                     "shards": [have[r] for r in sorted(have)],
                     "lora_meta": actor / "lora_train_meta.json"
                     if (actor / "lora_train_meta.json").is_file() else None})
    if not config.is_file():
        f.notes.append(f"no fsdp_config.json (verl before 0.4.1): world size {world} from the "
                       "file names")
    if missing:
        f.weights, f.refuse = "refused", (
            f"{actor}: {len(have)} of {world} FSDP shard files ({', '.join(missing)} missing): "
            "the save was interrupted or rotated out. Copy the missing file from the training "
            "machine, or leave this step out with --steps")
    found.append(f)


def trl(run: Path):
    found, skipped = [], []
    for step, d in _numbered(run, r"checkpoint-(\d+)"):
        state = d / "trainer_state.json"
        if not state.is_file():
            skipped.append(Skipped(d, "no trainer_state.json (transformers writes it last: the "
                                      "save did not finish)"))
            continue
        recorded = read_json(state).get("global_step")
        source = f"folder name {d.name} = trainer_state.json global_step {recorded}"
        if recorded != step:
            found.append(Found(step, f"folder name {d.name}", d, "refused", refuse=(
                f"{d}: trainer_state.json says global_step {recorded}; the folder says {step}. "
                f"Rename the folder to checkpoint-{recorded}, or leave it out with --steps")))
            continue
        f = _trl_weights(step, source, d)
        f.extra["trainer_state"] = state
        found.append(f)
    return found, skipped


def _trl_weights(step: int, source: str, d: Path) -> Found:
    if _hf_kind(d):
        return hf_found(step, source, d)
    tok = d if _has_tokenizer(d) else None
    fsdp = sorted(d.glob("pytorch_model_fsdp_*"))
    if fsdp and (fsdp[0] / ".metadata").is_file():
        return Found(step, source, d, "dcp", config_dir=d if (d / "config.json").is_file() else None,
                     tokenizer_dir=tok, extra={"dcp": fsdp[0], "unwrap": None})
    for tag_dir in sorted(d.glob("global_step*")):
        f = _deepspeed(step, source, d, d, tag_dir.name)
        if f is not None:
            f.config_dir = d if (d / "config.json").is_file() else None
            f.tokenizer_dir = tok
            return f
    return hf_found(step, source, d)  # refused, naming what is missing


def openrlhf(run: Path):
    found, skipped = [], []
    hf_steps = set()
    for step, d in _numbered(run, r"global_step(\d+)_hf"):
        found.append(hf_found(step, f"folder name {d.name}", d))
        hf_steps.add(step)
    ds_dir = run / "_actor"
    for step, d in _numbered(ds_dir, r"global_step(\d+)"):
        if step in hf_steps:
            continue  # the HF copy of the same step is used
        f = _deepspeed(step, f"DeepSpeed tag {d.name}", d, ds_dir, d.name)
        if f is None:
            skipped.append(Skipped(d, "neither mp_rank_00_model_states.pt nor ZeRO-3 model "
                                      "states: the save did not finish"))
        else:
            found.append(f)
    for _, d in _numbered(run, r"best_global_step(\d+)"):
        skipped.append(Skipped(d, "a best-evaluation copy of a step already listed"))
    return found, skipped


def open_instruct(run: Path):
    parents = [run] + sorted(p for p in run.glob("*_checkpoints") if p.is_dir())
    steps = [(s, d) for parent in parents for s, d in _numbered(parent, r"step_(\d+)")]
    marked = any((d / ".checkpoint_complete").is_file() for _, d in steps)
    found, skipped = [], []
    for step, d in steps:
        if marked and not (d / ".checkpoint_complete").is_file():
            skipped.append(Skipped(d, "no .checkpoint_complete (open-instruct touches it when "
                                      "the save is finished)"))
            continue
        found.append(hf_found(step, f"folder name {d.name}", d))
    return found, skipped


def nemo_rl(run: Path):
    found, skipped = [], []
    for p in sorted(run.glob("*_step_*")):
        if p.is_dir() and p.name.split("_step_")[0] in ("tmp", "old"):
            skipped.append(Skipped(p, "a save in progress (NeMo-RL renames tmp_step_N to step_N "
                                      "when it is finalized)"))
    for step, d in _numbered(run, r"step_(\d+)"):
        info = read_json(d / "training_info.json") if (d / "training_info.json").is_file() else {}
        recorded = info.get("step", info.get("current_step"))
        source = f"folder name {d.name}" + (f" = training_info.json step {recorded}"
                                           if recorded is not None else "")
        found.append(_nemo_weights(step, source, d))
        hint = _nemo_reference(d / "config.yaml")
        if hint:
            found[-1].extra["reference_hint"] = hint
    return found, skipped


def _nemo_weights(step: int, source: str, d: Path) -> Found:
    weights, tok = d / "policy" / "weights", d / "policy" / "tokenizer"
    tok = tok if _has_tokenizer(tok) else None
    if (weights / ".metadata").is_file():
        return Found(step, source, d, "dcp", tokenizer_dir=tok,
                     extra={"dcp": weights, "unwrap": "model"})
    if _hf_kind(weights) == "hf":
        f = hf_found(step, source, weights)
        f.tokenizer_dir = tok or f.tokenizer_dir
        return f
    return Found(step, source, d, "refused", refuse=(
        f"{weights}: neither a torch distributed checkpoint (.metadata) nor HF safetensors "
        "(Megatron iter_*?). Convert with NeMo-RL: python examples/converters/"
        f"convert_megatron_to_hf.py --config {d / 'config.yaml'} --megatron-ckpt-path "
        f"{weights} --hf-ckpt-path OUT/step_{step} ; then run discover on OUT with "
        "--framework folders"))


def _nemo_reference(config: Path):
    import yaml

    if not config.is_file():
        return None
    try:
        cfg = yaml.safe_load(config.read_text()) or {}
    except yaml.YAMLError:
        return None
    return (cfg.get("policy") or {}).get("model_name")

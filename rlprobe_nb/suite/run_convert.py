"""What each found checkpoint becomes in a suite (a model spec), and the conversions that
get it there: each into its own folder under the cache (the run folder is never written),
built in a temporary folder and renamed into place, with ``converted.json`` recording the
source files (size and time) and the sha256 of every file written. A re-run reuses a
conversion whose sources and outputs still match the record.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from rlprobe_nb.suite import convert_fsdp, convert_states
from rlprobe_nb.suite.run_layouts import DiscoverError, Found
from rlprobe_nb.tables.atomic import atomic_folder, atomic_write_json, read_json
from rlprobe_nb.tables.provenance import sha256_file

RECORD = "converted.json"
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt",
                   "added_tokens.json")
CONVERTER_VERSION = 1


def action(f: Found, options: dict) -> str:
    """The plan's word for a checkpoint: use as is, convert (what), or refuse."""
    if f.refuse:
        return "refuse"
    if f.weights == "hf" and f.tokenizer_dir is not None:
        return "use as is (local)"
    if f.weights == "peft":
        return "use as is (peft over the reference)"
    if f.weights == "hub":
        return "use as is (hub)"
    what = {"hf": "tokenizer shim", "peft_bin": "adapter .bin -> safetensors",
            "fsdp_shards": f"merge {f.extra.get('world_size')} FSDP shards",
            "ds_zero12": "DeepSpeed ZeRO-1/2 module -> safetensors",
            "dcp": "distributed checkpoint -> safetensors"}[f.weights]
    if f.extra.get("lora"):
        what += " (LoRA adapter)"
    return f"convert: {what}, ≈ {_size(sources(f)) / 1e6:,.1f} MB in"


def _size(files: list[Path]) -> int:
    return sum(p.stat().st_size for p in files)


def sources(f: Found) -> list[Path]:
    """The files a conversion reads from the run folder."""
    if f.weights == "fsdp_shards":
        return list(f.extra["shards"])
    if f.weights == "ds_zero12":
        return [f.extra["states"]]
    if f.weights == "dcp":
        return sorted(p for p in Path(f.extra["dcp"]).iterdir() if p.is_file())
    if f.weights == "peft_bin":
        return [f.folder / "adapter_model.bin", f.folder / "adapter_config.json"]
    if f.weights == "hf":
        return sorted(p for p in f.folder.iterdir() if p.is_file())
    return []


def _stamps(files: list[Path]) -> dict:
    return {str(p): [p.stat().st_size, p.stat().st_mtime_ns] for p in files}


def _copy_named(names, src: Optional[Path], dst: Path) -> list[str]:
    copied = []
    for name in names:
        if src is not None and (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def is_current(out: Path, f: Found) -> bool:
    """A finished conversion of the same sources whose files still hash as recorded."""
    record_file = out / RECORD
    if not record_file.is_file():
        return False
    record = read_json(record_file)
    if record.get("sources") != _stamps(sources(f)) or record.get("version") != CONVERTER_VERSION:
        return False
    return all((out / n).is_file() and sha256_file(out / n) == h
               for n, h in record.get("outputs", {}).items())


def convert(f: Found, out: Path, ref_dir: Optional[Path], options: dict) -> dict:
    """Convert one checkpoint into ``out`` (atomically); the record written there."""
    if is_current(out, f):
        record = read_json(out / RECORD)
        record["reused"] = True
        return record
    dtype = None if options.get("dtype", "keep") == "keep" else options["dtype"]
    with atomic_folder(out) as tmp:
        _write(f, tmp, ref_dir, dtype, options)
        outputs = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())
                   if p.is_file() and not p.is_symlink()}
        record = {"version": CONVERTER_VERSION, "weights": f.weights, "dtype": dtype or "keep",
                  "lora": bool(f.extra.get("lora")), "sources": _stamps(sources(f)),
                  "outputs": outputs}
        atomic_write_json(tmp / RECORD, record)
    return record


def _write(f: Found, tmp: Path, ref_dir: Optional[Path], dtype, options: dict) -> None:
    if f.weights == "peft_bin":
        convert_states.write_peft_bin(f.folder, tmp)
        return
    if f.weights == "fsdp_shards" and f.extra.get("lora"):
        r, alpha = f.extra["lora_r"], f.extra["lora_alpha"]
        convert_fsdp.write_fsdp_lora(f.extra["shards"], tmp, r, alpha, dtype)
        return
    if f.weights == "hf":  # a tokenizer shim: the weights linked, the tokenizer copied
        for p in sources(f):
            if p.name not in TOKENIZER_FILES:
                os.symlink(p.resolve(), tmp / p.name)
    elif f.weights == "fsdp_shards":
        convert_fsdp.write_fsdp_full(f.extra["shards"], tmp, dtype)
    elif f.weights == "ds_zero12":
        convert_states.write_zero12(f.extra["states"], tmp, dtype, options.get("reference_keys"))
    elif f.weights == "dcp":
        convert_states.write_dcp(Path(f.extra["dcp"]), tmp, f.extra.get("unwrap"), dtype,
                                 options.get("reference_keys"))
    else:
        raise DiscoverError(f"{f.folder}: nothing converts weights of kind {f.weights!r}")
    if f.weights != "hf" and not _copy_named(CONFIG_FILES, f.config_dir, tmp):
        if not _copy_named(CONFIG_FILES, ref_dir, tmp):
            raise DiscoverError(f"{f.folder}: no config.json here nor in the reference folder; "
                                "give --reference as a local folder with config.json")
    if not _copy_named(TOKENIZER_FILES, f.tokenizer_dir, tmp):
        if not _copy_named(TOKENIZER_FILES, ref_dir, tmp):
            raise DiscoverError(f"{f.folder}: no tokenizer here nor in the reference folder; "
                                "give --reference as a local folder with the tokenizer")

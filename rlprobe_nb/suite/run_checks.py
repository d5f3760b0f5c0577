"""What ``discover`` checks before any weights are loaded: the reference given on the
command line (a folder, a GGUF file or a hub id), and each checkpoint's architecture
(config.json) and tokenizer identity (vocabulary, specials and chat template) against it.
A checkpoint that differs is refused, with the difference named: the book compares only
models that share token ids and a chat template."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from rlprobe_nb.suite.run_layouts import Found
from rlprobe_nb.suite.tokenizers import identity_diff, tokenizer_identity

ARCH_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
             "num_attention_heads", "num_key_value_heads")
_WHAT = {"size": "vocabulary sizes", "vocab_sha256": "vocabularies", "specials": "special tokens",
         "added_special": "added special tokens", "chat_template_sha256": "chat templates"}


def reference_spec(ref: str) -> dict:
    """The model spec of --reference: a folder (local), a .gguf file, or org/name[@rev]."""
    path = Path(os.path.expanduser(ref))
    if path.is_dir():
        return {"kind": "local", "path": str(path.resolve())}
    if path.suffix == ".gguf" and path.is_file():
        return {"kind": "gguf", "path": str(path.resolve())}
    repo, _, rev = ref.partition("@")
    return {"kind": "hub", "id": repo, "revision": rev or "main"}


def reference_folder(spec: dict) -> Optional[Path]:
    """A local folder with the reference's config.json and tokenizer, or None (a hub model
    whose files are neither cached nor reachable)."""
    if spec["kind"] == "local":
        return Path(spec["path"])
    from rlprobe_nb.suite import paths

    if spec["kind"] == "gguf":
        from rlprobe_nb.suite import gguf_cache

        return gguf_cache.convert_gguf(Path(spec["path"]), paths.cache_dir() / "models")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec["id"], revision=spec["revision"],
                                      allow_patterns=["*.json", "*.jinja", "tokenizer*"]))
    except Exception:
        return None


def reference_keys(ref_dir: Optional[Path]) -> Optional[set]:
    """The reference's weight names, from its safetensors headers (no weights read)."""
    if ref_dir is None:
        return None
    index = ref_dir / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    single = ref_dir / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), "pt") as f:
            return set(f.keys())
    return None


def _config(folder: Optional[Path]) -> Optional[dict]:
    if folder is None or not (folder / "config.json").is_file():
        return None
    cfg = json.loads((folder / "config.json").read_text())
    return {k: cfg.get(k) for k in ARCH_KEYS}


def check_architecture(f: Found, ref_dir: Optional[Path]) -> None:
    mine, ref = _config(f.config_dir), _config(ref_dir)
    if mine is None or ref is None:
        f.notes.append("architecture not checked (no config.json on one side)")
        return
    diff = {k: (mine[k], ref[k]) for k in ARCH_KEYS if mine[k] != ref[k] and ref[k] is not None}
    if diff:
        f.refuse = (f"{f.config_dir / 'config.json'}: not the reference's architecture "
                    f"({', '.join(f'{k} {a} vs {b}' for k, (a, b) in diff.items())}). Is "
                    "--reference the model this run started from? Pass the right one")


class TokenizerCheck:
    """Tokenizer identities by folder, each computed once."""

    def __init__(self, ref_dir: Optional[Path]):
        self.ref_dir = ref_dir
        self.memo: dict[str, dict] = {}
        self.ref = self.identity(ref_dir) if ref_dir is not None else None

    def identity(self, folder: Path) -> dict:
        key = str(folder)
        if key not in self.memo:
            from transformers import AutoTokenizer

            from rlprobe_nb.suite.models import _finish_tokenizer

            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                trust_remote_code=False)
            self.memo[key] = tokenizer_identity(_finish_tokenizer(tok))
        return self.memo[key]

    def check(self, f: Found) -> None:
        if f.tokenizer_dir is None:
            if f.weights not in ("peft", "peft_bin"):  # an adapter uses its base's anyway
                f.notes.append("no tokenizer here (or --tokenizer-from reference): the "
                               "reference's is used")
            return
        if self.ref is None:
            f.notes.append("tokenizer not checked (the reference's files are not reachable)")
            return
        diff = identity_diff(self.identity(f.tokenizer_dir), self.ref)
        if diff:
            what = ", ".join(_WHAT.get(k, k) for k in diff)
            f.refuse = (
                f"{f.tokenizer_dir}: its tokenizer differs from the reference's ({what} differ; "
                "a custom chat template, e.g. verl's custom_chat_template or open-instruct's "
                "chat_template_name?). The book compares only models with one tokenizer. Copy "
                f"the tokenizer you mean into both, or convert with --tokenizer-from reference "
                "(the checkpoint then gets the reference's tokenizer files)")

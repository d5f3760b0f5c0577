"""What two models must share to be compared token by token, in one place: the
tokenizer identity recorded in manifests and hidden-state caches, and the refusal to
compare models whose tokenizers (or chat templates) differ."""

from __future__ import annotations

import hashlib
import json

_WHAT = {
    "size": "vocabulary sizes differ",
    "vocab_sha256": "vocabularies differ",
    "specials": "special tokens differ",
    "added_special": "added special tokens differ",
    "chat_template_sha256": "chat templates differ",
}


def tokenizer_identity(tokenizer) -> dict:
    """Hashes of everything that decides the token ids of a forced sequence."""
    vocab = tokenizer.get_vocab()
    vocab_blob = json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]), ensure_ascii=False)
    specials = {name: getattr(tokenizer, name, None)
                for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    template = getattr(tokenizer, "chat_template", None) or ""
    return {
        "size": len(tokenizer),
        "vocab_sha256": hashlib.sha256(vocab_blob.encode()).hexdigest(),
        "specials": {k: (str(v) if v is not None else None) for k, v in specials.items()},
        "added_special": sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", [])),
        "chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest(),
    }


def identity_diff(a: dict, b: dict) -> list[str]:
    return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_identities(a: dict, b: dict, names=("a", "b")) -> None:
    diff = identity_diff(a, b)
    if diff:
        what = "; ".join(_WHAT.get(k, f"{k} differs") for k in diff)
        raise ValueError(
            f"models {names[0]!r} and {names[1]!r} have different tokenizers: {what} "
            f"(sizes {a.get('size')} vs {b.get('size')}). Per-token divergences need the same "
            "token ids on both sides: compare only models that share a tokenizer")


def check_same_tokenizer(tok_a, tok_b, names=("a", "b")) -> None:
    """Refuse to compare two models whose tokenizers differ."""
    check_identities(tokenizer_identity(tok_a), tokenizer_identity(tok_b), names)

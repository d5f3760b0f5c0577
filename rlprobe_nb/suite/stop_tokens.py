"""Where a model's generation stops: part of the model's identity, declared, never guessed.

A model trained to end its answers with a token must be sampled to stop at that token;
sampled past it, it writes on (an invented next turn, more boxes) and every table built
from those samples is wrong. Which token that is can differ from what a tokenizer
conversion calls EOS (one transformers version converts a GGUF's tokenizer with another
EOS than the next), so a suite declares it: ``stop_tokens`` on a model spec, a list of
token texts, inherited by a peft model from its base. Without a declaration a model stops
at its own EOS ids (generation config and tokenizer), as transformers would.

The declared texts enter the model's identity (and so every table's key): tables made
with another stop set are stale. A trained adapter may record the stop tokens it was
trained with in its training record (``TRAINING_RECORD``); a suite that declares another
set is refused before any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

TRAINING_RECORD = "rlprobe_training.json"


class StopTokenError(ValueError):
    """A declared stop token is unknown, or disagrees with what a model was trained with."""


def declared(name: str, P) -> Optional[list[str]]:
    """The stop-token texts the suite declares for a model (a peft model: its base's
    unless it declares its own), or None."""
    spec = P.model_spec(name)
    if "stop_tokens" in spec:
        return list(spec["stop_tokens"])
    if spec["kind"] == "peft":
        return declared(spec["base"], P)
    return None


def ids_of(texts: list[str], tokenizer, name: str) -> list[int]:
    """Token ids of stop-token texts; each must be exactly one token of the tokenizer."""
    ids = []
    for text in texts:
        token_id = tokenizer.convert_tokens_to_ids(text)
        if token_id is None or tokenizer.convert_ids_to_tokens(int(token_id)) != text:
            raise StopTokenError(
                f"model {name!r}: stop token {text!r} is not a token of its tokenizer; "
                "list tokens exactly as the tokenizer spells them (e.g. '<|im_end|>')")
        ids.append(int(token_id))
    return sorted(set(ids))


def default_ids(model, tokenizer) -> list[int]:
    """A model's own EOS ids: its generation config's and its tokenizer's."""
    found: set[int] = set()
    for source in (getattr(model.generation_config, "eos_token_id", None),
                   tokenizer.eos_token_id):
        if source is not None:
            found.update([source] if isinstance(source, int) else source)
    if not found:
        raise StopTokenError("the tokenizer and model define no EOS token and the suite "
                             "declares no stop_tokens: generation could not stop")
    return sorted(int(i) for i in found)


def resolve(name: str, P, model, tokenizer) -> list[int]:
    """The ids generation of model ``name`` stops at."""
    texts = declared(name, P)
    return ids_of(texts, tokenizer, name) if texts is not None else default_ids(model, tokenizer)


def read_training_record(folder: Path) -> Optional[dict]:
    """The training record of an adapter folder (None when it has none), or an error
    naming the file when it is not a JSON mapping."""
    from rlprobe_nb.tables.atomic import read_json_object

    record = Path(folder) / TRAINING_RECORD
    if not record.is_file():
        return None
    return read_json_object(record, "restore it from the training run that wrote the adapter")


def check_recorded(name: str, recorded: Optional[list[str]], suite_texts: Optional[list[str]],
                   where: Path | str) -> None:
    """Refuse a model whose training stopped at other tokens than the suite declares."""
    if recorded is None:
        return
    if not isinstance(recorded, list) or not all(isinstance(t, str) and t for t in recorded):
        raise StopTokenError(
            f"{where}: its stop_tokens is {recorded!r}, not a list of token texts (e.g. "
            "['<|im_end|>']): the file is damaged or hand-edited; restore it from the run "
            "that wrote it")
    if suite_texts is None or sorted(recorded) != sorted(suite_texts):
        said = "declares none (the tokenizer's EOS would decide)" if suite_texts is None \
            else f"declares {sorted(suite_texts)}"
        raise StopTokenError(
            f"model {name!r} was trained to stop at {sorted(recorded)} ({where}), but the "
            f"suite {said}: its samples would not stop where training stopped. Declare "
            f"stop_tokens: {sorted(recorded)} on the model (or on its base) in suite.yaml")

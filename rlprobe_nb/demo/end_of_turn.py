"""Where the demo models end their answers: the GGUF's own end-of-sequence token.

Training appends EOS to every supervised target and stops sampling there, so that token
becomes part of every trained model's identity. It is taken from the GGUF file's
metadata, never from the tokenizer conversion, which depends on the transformers version
(5.17 converts the demo tokenizer with EOS ``<|im_start|>``, 5.24 with ``<|im_end|>``,
as the metadata says). A tokenizer that disagrees with the metadata is refused before any
training step; the stop token is written into every saved adapter's training record
and into the run's ``run.json``, and the book refuses a suite that declares others.
"""

from __future__ import annotations

from rlprobe_nb.suite import gguf_cache


class EndOfTurnMismatch(RuntimeError):
    """The converted tokenizer's EOS is not the one the GGUF's metadata names."""


def metadata_stop() -> dict:
    """The demo base model's stop token from its GGUF metadata, as a run records it."""
    token_id, text = gguf_cache.metadata_eos(gguf_cache.demo_gguf_path())
    return {"stop_tokens": [text], "stop_token_ids": [token_id],
            "stop_source": "GGUF metadata tokenizer.ggml.eos_token_id"}


def check_tokenizer(tokenizer) -> dict:
    """The stop record, after checking that the tokenizer's EOS is the metadata's."""
    import transformers

    stop = metadata_stop()
    (token_id,), (text,) = stop["stop_token_ids"], stop["stop_tokens"]
    if tokenizer.eos_token_id != token_id:
        raise EndOfTurnMismatch(
            f"transformers {transformers.__version__} converts the demo GGUF's tokenizer with "
            f"EOS {tokenizer.eos_token!r} (id {tokenizer.eos_token_id}), but the GGUF's metadata "
            f"names {text!r} (id {token_id}). Training would teach the models to end their "
            "answers with the wrong token. Install the project's pinned transformers "
            "(constraints.txt) and delete the converted model under the cache folder.")
    return stop


def training_model(dtype=None, device: str | None = None):
    """The demo base model and its tokenizer for training, with the EOS check done."""
    model, tokenizer = gguf_cache.demo_model(dtype=dtype, device=device)
    check_tokenizer(tokenizer)
    return model, tokenizer

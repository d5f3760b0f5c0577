"""The model body (embeddings, decoder layers, final norm) without its LM head: the
forward that gives final hidden states at the positions that predict response tokens,
and regional compilation of the decoder layers."""

from __future__ import annotations

import torch


def model_context(model) -> int | None:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "max_position_embeddings", None)


def decoder_of(model):
    """The model body (embeddings, layers, final norm) without the LM head."""
    getter = getattr(model, "get_decoder", None)
    body = getter() if callable(getter) else None
    if body is None:
        body = getattr(model, "model", None)
    if body is None:
        raise TypeError(f"cannot find the decoder body of {type(model).__name__}")
    return body


def compile_layers(model, enable: bool = True) -> int:
    """torch.compile each decoder layer of the body in place (``enable=False`` undoes it).

    Regional compilation: identical layers share one compiled graph, so it compiles in
    seconds, not the minutes of a whole-model compile; dynamic shapes, so the bucketed
    batches of varying width do not recompile. It fuses the norms, rotary embedding,
    activation and residual adds; the matmuls are the same cuBLAS calls. Inductor's
    deterministic mode: no kernel is chosen by timing it on the device, so every process
    compiles the same kernels and a token table does not depend on how many GPUs computed
    it. Hidden states can differ from eager in the last bf16 bit (as they do between batch
    sizes); the divergence math downstream is unchanged. Returns the number of layers.
    """
    body = decoder_of(model)
    layers = list(getattr(body, "layers", []))
    if not layers:
        raise TypeError(f"cannot find the decoder layers of {type(model).__name__}")
    for module in layers + [m for m in (getattr(body, "norm", None),) if m is not None]:
        if enable:
            module.compile(dynamic=True, options={"deterministic": True})
        else:
            module._compiled_call_impl = None
    return len(layers)


def layers_compiled(model) -> bool:
    """Whether any decoder layer of the model is compiled (by compile_layers or the user)."""
    body = decoder_of(model)
    return any(getattr(m, "_compiled_call_impl", None) is not None
               for m in getattr(body, "layers", []))


def forward_hidden(model, ids: torch.Tensor, mask: torch.Tensor | None,
                   rows: torch.Tensor) -> torch.Tensor:
    """Final normed hidden states [n_rows, hidden] at the given flat positions (body only:
    the LM head is never applied to the whole batch)."""
    body = decoder_of(model)
    with torch.inference_mode():
        out = body(input_ids=ids, attention_mask=mask, use_cache=False)
    h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return h.reshape(-1, h.shape[-1]).index_select(0, rows)

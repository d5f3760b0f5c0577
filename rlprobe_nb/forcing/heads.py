"""LM heads applied with float32 output, chunk by chunk, and every metric of a pair of
hidden-state blocks (metrics.token_metrics does the math).

The head is restricted to the tokenizer's vocabulary when the model has padded extra
rows; bf16 weights on CUDA use torch.mm(..., out_dtype=float32) (fp32 accumulation, no
reduced-precision reductions), on CPU an fp32 upcast. No [tokens x vocab] tensor is ever
held whole: ``pair_metrics`` holds two [chunk, vocab] logit blocks at a time.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch

from rlprobe_nb.forcing import metrics


@dataclass
class LMHead:
    """The LM head restricted to the tokenizer's vocabulary, applied with fp32 output."""

    weight: torch.Tensor  # [vocab, hidden], model dtype
    bias: torch.Tensor | None = None
    softcap: float | None = None
    rows_in_model: int = 0
    padded_rows_dropped: int = 0
    # the rows beyond the tokenizer (None when there are none or the head came from a
    # cache): kept only to check how much probability the model puts there
    padded_weight: torch.Tensor | None = None
    padded_bias: torch.Tensor | None = None
    padded_mass_max: float | None = None  # the largest such mass seen at any position

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    def to(self, device) -> "LMHead":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return LMHead(move(self.weight), move(self.bias), self.softcap, self.rows_in_model,
                      self.padded_rows_dropped, move(self.padded_weight),
                      move(self.padded_bias), self.padded_mass_max)

    def facts(self) -> dict:
        return {"vocab_size": self.vocab_size, "rows_in_model": self.rows_in_model,
                "padded_rows_dropped": self.padded_rows_dropped,
                "padded_mass_max": self.padded_mass_max,
                "dtype": str(self.weight.dtype).replace("torch.", ""),
                "softcap": self.softcap, "bias": self.bias is not None}


# Probability a model may put on head rows beyond its tokenizer before it is refused:
# trained models leave ~0 there; more means model and tokenizer do not belong together.
PADDED_MASS_TOLERANCE = 1e-4


def check_padded_mass(h: torch.Tensor, head: LMHead, name: str, chunk: int = 1024) -> None:
    """Refuse a model that puts probability on head rows beyond the tokenizer's vocabulary
    (the engine drops those rows, which is exact only if their mass is ~0); record the
    largest mass seen in ``head.padded_mass_max``."""
    if head.padded_weight is None or h.shape[0] == 0:
        return
    worst = head.padded_mass_max or 0.0
    for s in range(0, h.shape[0], chunk):
        main = head_logits(h[s:s + chunk], head)
        extra = head_logits(h[s:s + chunk], LMHead(head.padded_weight, head.padded_bias,
                                                   head.softcap))
        lse_main, lse_extra = main.logsumexp(-1), extra.logsumexp(-1)
        mass = torch.exp(lse_extra - torch.logaddexp(lse_main, lse_extra))
        worst = max(worst, float(mass.max()))
    head.padded_mass_max = worst
    if worst > PADDED_MASS_TOLERANCE:
        raise ValueError(
            f"{name}: the model puts up to {worst:.3g} of its probability on the "
            f"{head.padded_rows_dropped} LM-head rows beyond the tokenizer's {head.vocab_size} "
            f"tokens (tolerance {PADDED_MASS_TOLERANCE}); model and tokenizer do not belong "
            "together, or the head is not padded the usual way: check the model")


def lm_head_of(model, vocab_size: int) -> LMHead:
    """The effective output projection (LoRA deltas included), sliced to ``vocab_size``."""
    cfg = getattr(model, "config", None)
    scale = getattr(cfg, "logit_scale", None)
    if scale not in (None, 1, 1.0):
        raise NotImplementedError(f"{type(model).__name__} scales its logits "
                                  f"(logit_scale={scale}); not supported by the engine yet")
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    base = getattr(head, "base_layer", None)
    if base is not None:  # a PEFT-wrapped head: base weight + unmerged adapter deltas
        weight, bias = base.weight, getattr(base, "bias", None)
        if not getattr(head, "merged", False) and not getattr(head, "disable_adapters", False):
            for name in getattr(head, "active_adapters", []):
                if name in getattr(head, "lora_A", {}):
                    weight = weight + head.get_delta_weight(name).to(weight.dtype)
    weight = weight.detach()
    rows = int(weight.shape[0])
    if rows < vocab_size:
        raise ValueError(f"the LM head has {rows} rows but the tokenizer has {vocab_size} "
                         "tokens: model and tokenizer do not belong together")
    softcap = getattr(cfg, "final_logit_softcapping", None)
    extra = rows > vocab_size
    return LMHead(weight[:vocab_size], None if bias is None else bias.detach()[:vocab_size],
                  float(softcap) if softcap else None, rows, rows - vocab_size,
                  weight[vocab_size:] if extra else None,
                  bias.detach()[vocab_size:] if extra and bias is not None else None)


_MM_OUT_DTYPE_OK: dict[str, bool] = {}


@contextlib.contextmanager
def _exact_matmul():
    """No TF32 and no reduced-precision bf16 reductions inside the head matmul."""
    cuda = torch.backends.cuda.matmul
    saved = (cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction)
    cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction = False, False
    try:
        yield
    finally:
        cuda.allow_tf32, cuda.allow_bf16_reduced_precision_reduction = saved


def head_method(h: torch.Tensor, head: LMHead) -> str:
    if head.weight.dtype == torch.float32 and h.dtype == torch.float32:
        return "fp32"
    if head.weight.dtype == torch.float64:
        return "fp64_rounded_to_fp32"  # float64 models (tests): exact logits, rounded once
    if h.device.type == "cuda" and _MM_OUT_DTYPE_OK.get("cuda", True):
        return "mm_out_dtype_fp32"
    return "upcast_fp32"


def head_logits(h: torch.Tensor, head: LMHead) -> torch.Tensor:
    """float32 logits [n, vocab] for hidden states h [n, hidden] (one chunk)."""
    w = head.weight
    if h.dtype != w.dtype:
        h = h.to(w.dtype)
    with _exact_matmul():
        method = head_method(h, head)
        out = None
        if method == "fp32":
            out = torch.mm(h, w.t())
        elif method == "fp64_rounded_to_fp32":
            out = torch.mm(h, w.t()).float()
        elif method == "mm_out_dtype_fp32":
            try:
                out = torch.mm(h, w.t(), out_dtype=torch.float32)
            except (RuntimeError, TypeError) as err:
                warnings.warn(f"torch.mm(out_dtype=float32) unavailable ({err}); upcasting "
                              "the LM head per vocabulary slice instead (exact, slower)")
                _MM_OUT_DTYPE_OK["cuda"] = False
        if out is None:  # upcast in vocabulary slices so the fp32 copy stays small
            out = torch.empty(h.shape[0], w.shape[0], dtype=torch.float32, device=h.device)
            hf = h.float()
            step = 8192
            for s in range(0, w.shape[0], step):
                torch.mm(hf, w[s:s + step].float().t(), out=out[:, s:s + step])
    if head.bias is not None:
        out += head.bias.float()
    if head.softcap:
        out = torch.tanh(out / head.softcap) * head.softcap
    return out.float()


def pair_metrics(h_p: torch.Tensor, h_q: torch.Tensor, head_p: LMHead, head_q: LMHead,
                 targets: torch.Tensor, chunk_positions: int, topk: int,
                 row_fn=None) -> torch.Tensor:
    """Every metric for n rows, as one float32 [n, 12 + 4*topk] tensor on the device (see
    ``METRIC_COLUMNS``; ranks and ids are exact in float32 below 2^24), computed chunk by
    chunk: two fp32 [chunk, vocab] logit blocks plus divergence's temporaries at a time."""
    if head_p.vocab_size != head_q.vocab_size:
        raise ValueError(f"vocabulary sizes differ ({head_p.vocab_size} vs "
                         f"{head_q.vocab_size}): the tokenizers cannot be the same")
    if head_p.vocab_size >= 2 ** 24:
        raise ValueError("vocabulary too large for the packed float32 result")
    n = h_p.shape[0]
    width = len(metrics.FLOAT_METRICS) + 2 + 4 * topk
    out = torch.empty((n, width), dtype=torch.float32, device=h_p.device)
    with torch.inference_mode():
        for s in range(0, n, chunk_positions):
            e = min(n, s + chunk_positions)
            lp = head_logits(h_p[s:e], head_p)
            lq = head_logits(h_q[s:e], head_q)
            m = metrics.token_metrics(lp, lq, targets[s:e], topk, row_fn=row_fn)
            del lp, lq
            col = 0
            for name in metrics.FLOAT_METRICS:
                out[s:e, col] = m[name]
                col += 1
            for name in metrics.INT_METRICS:
                out[s:e, col] = m[name].float()
                col += 1
            if topk:
                for name in metrics.TOPK_METRICS:
                    out[s:e, col:col + topk] = m[name].float()
                    col += topk
    return out


METRIC_COLUMNS = metrics.FLOAT_METRICS + metrics.INT_METRICS

"""Fused input projections for decoding on a GPU: each attention layer's q, k and v
projections, and each MLP's gate and up projections, as one matrix product.

A decode step multiplies a few rows by every weight matrix once, so each product is bound
by reading its weights, and a small product (k and v are a quarter of q in grouped-query
attention) reads them at a fraction of the bandwidth one larger product reaches. Here the
weights of a group move into one tensor, each module's own weight becoming a view of it
(no extra memory, the same values). Within ``fused(model)`` the group's first projection
computes the whole product and the others return their slices of it; outside, every
module computes its own product as before. Only groups of plain ``nn.Linear`` modules fed
the same input are fused; a module whose ``forward`` is already wrapped (accelerate's
device hooks) leaves its model unfused.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def _groups(model) -> list[list[torch.nn.Linear]]:
    """The fusable groups of the decoder layers (none if any module is already wrapped)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    found = []
    for layer in layers:
        for parent, names in GROUPS:
            mods = [getattr(getattr(layer, parent, None), name, None) for name in names]
            if not all(isinstance(m, torch.nn.Linear) for m in mods):
                continue
            if len({m.in_features for m in mods}) != 1 or len({m.bias is None for m in mods}) != 1:
                continue
            found.append(mods)
    if any("forward" in m.__dict__ for mods in found for m in mods):
        return []
    return found


def _joined(mods: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The group's weight and bias as single tensors, the modules' own becoming views of
    them; done once, and again if a module's weight has been replaced since."""
    held = getattr(mods[0], "_rlprobe_joined", None)
    if held is not None:
        weight, bias = held
        rows = [0] + [m.out_features for m in mods]
        offsets = torch.tensor(rows).cumsum(0).tolist()
        if all(m.weight.data_ptr() == weight[start].data_ptr()
               for m, start in zip(mods, offsets)):
            return held
    weight = torch.cat([m.weight.detach() for m in mods])
    bias = None if mods[0].bias is None else torch.cat([m.bias.detach() for m in mods])
    start = 0
    for m in mods:
        m.weight.data = weight[start:start + m.out_features]
        if bias is not None:
            m.bias.data = bias[start:start + m.out_features]
        start += m.out_features
    object.__setattr__(mods[0], "_rlprobe_joined", (weight, bias))  # not a submodule/param
    return weight, bias


def _patch(mods: list[torch.nn.Linear]) -> None:
    weight, bias = _joined(mods)
    sizes = [m.out_features for m in mods]
    last: dict = {}

    def first(x: torch.Tensor) -> torch.Tensor:
        last["input"], last["parts"] = x, F.linear(x, weight, bias).split(sizes, dim=-1)
        return last["parts"][0]

    def part(i: int):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if x is not last.get("input"):
                raise RuntimeError("fused projections: a later projection of a group got "
                                   "another input than the first")
            return last["parts"][i]
        return forward

    mods[0].forward = first
    for i, m in enumerate(mods[1:], start=1):
        m.forward = part(i)


@contextlib.contextmanager
def fused(model) -> Iterator[int]:
    """Within the block, the model's fusable projection groups compute one product each;
    yields how many groups were fused."""
    groups = _groups(model)
    try:
        for mods in groups:
            _patch(mods)
        yield len(groups)
    finally:
        for mods in groups:
            for m in mods:
                m.__dict__.pop("forward", None)

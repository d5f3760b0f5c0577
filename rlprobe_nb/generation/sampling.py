"""Seeded sampling: each row's next token is a pure function of its seed, its step and its
logits, computed with tensor operations on the logits' own device.

Gumbel-max. With independent standard Gumbel noises g_v, ``argmax_v logits_v / T + g_v``
is distributed exactly as softmax(logits / T). The noise of vocabulary entry v at step k
(the index of the token being drawn, 0 for the first response token) of a row with seed s
is ``g = -log(-log(u))``, ``u = (h + 1/2) / 2**32``, where h is a 32-bit counter-based
hash of (s, k, v): a 64-bit row key (k1, k2) is mixed from (s, k); the token's own code
mix(v) is xored with k1, mixed again, and xored with k2 (mix: a bijective 32-bit integer
mixer). It is int64 tensor arithmetic that never overflows, so it is the same integer on
every device; the scores are float64. So a draw does not depend on the batch it is in, on
the batch size, on the process or on the device: what remains is the logits' own rounding,
and a draw can differ between devices only where two scores tie to the last bits of
float64. ``T = 0`` is greedy (argmax of the logits, first index on ties). The law is exact
up to the 32-bit resolution of u: the noise is cut at g <= 22.9 (a Gumbel exceeds that
with probability 1.2e-10).

Two exact ways to the same draw: on a GPU every score is computed (``draw_full``: one
fused kernel when compiled, no host synchronisation, so it fits in a CUDA graph); on the
CPU only the tokens that can still win get float64 scores (``draw_pruned``), which is
usually a few hundred of 49k; the hash that finds them runs in uint32 there (the same
integers, a third of the time of the int64 form).

``SeededLogitsProcessor`` puts the same draw in HF ``generate`` (greedy decoding over
scores that are -inf except at the drawn token); ``decoding`` is the book's own loop.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

_M32 = 0xFFFFFFFF


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """Wellons' lowbias32, a bijective 32-bit mixer, in place on an int64 tensor of values
    in [0, 2**32) (in place: a [48, 49152] batch allocates one temporary, not ten). The
    multiplications never reach 2**63; the one by a constant above 2**31 goes by halves."""
    t = x >> 16
    x ^= t
    x.mul_(0x7FEB352D).bitwise_and_(_M32)
    torch.bitwise_right_shift(x, 15, out=t)
    x ^= t
    hi, lo = 0x846CA68B >> 16, 0x846CA68B & 0xFFFF
    torch.mul(x, hi, out=t)
    t.bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    x.mul_(lo).add_(t).bitwise_and_(_M32)
    torch.bitwise_right_shift(x, 16, out=t)
    x ^= t
    return x


def row_keys(seeds: torch.Tensor, steps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit key words per row from its seed (0 <= s < 2**63) and step."""
    a = _mix32_((seeds & _M32) ^ 0x9E3779B9)
    a = _mix32_(a ^ ((seeds >> 32) & _M32))
    a = _mix32_(a ^ (steps & _M32))
    return a, _mix32_(a ^ 0x632BE5AB)


def _codes(tokens: torch.Tensor) -> torch.Tensor:
    """Each token's own code, the same for every row and step."""
    return _mix32_(tokens ^ 0x5BD1E995)


_VOCAB_CODES: dict = {}


def vocab_codes(size: int, device) -> torch.Tensor:
    key = (int(size), str(device))
    if key not in _VOCAB_CODES:
        _VOCAB_CODES[key] = _codes(torch.arange(size, device=device))
    return _VOCAB_CODES[key]


def _bits(k1: torch.Tensor, k2: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The 32-bit hash of (row key, token code): one keyed round per (row, token)."""
    x = _mix32_(codes ^ k1)
    x ^= k2
    return x


def _gumbel(bits: torch.Tensor) -> torch.Tensor:
    u = (bits.double() + 0.5) * 2.0 ** -32
    return -torch.log(-torch.log(u))


def noise(k1: torch.Tensor, k2: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise (float64) of ``tokens`` under the row keys (k1, k2), broadcast."""
    return _gumbel(_bits(k1, k2, _codes(tokens)))


# Pruning on the CPU. A token more than CUT below the top token's score (in units of
# logits / T) can win only with a noise above CUT, i.e. with hash bits of at least
# BITS_AT_CUT (lowered by 1024 of 2**32: a superset whatever the rounding of the logs);
# about exp(-CUT) = 0.1% of the tokens have such bits.
CUT = 7.0
BITS_AT_CUT = math.floor(math.exp(-math.exp(-CUT)) * 2.0 ** 32 - 0.5) - 1024
_MARGIN = 1e-6  # relative slack for the rounding of logits / T, far above float64's


def check_seeds(seeds) -> torch.Tensor:
    seeds = [int(s) for s in seeds]
    if any(s < 0 or s >= 2 ** 63 for s in seeds):
        raise ValueError("seeds must be integers in [0, 2**63)")
    return torch.tensor(seeds, dtype=torch.long)


def draw_full(logits: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor,
              temperatures: torch.Tensor, codes: torch.Tensor | None = None) -> torch.Tensor:
    """Every score computed: rows [B, V] of logits, keys and float64 temperatures [B]
    (``codes``: ``vocab_codes`` of the vocabulary, computed here if not given)."""
    if codes is None:
        codes = vocab_codes(logits.shape[-1], logits.device)
    sampled = temperatures > 0
    z = logits.double() / torch.where(sampled, temperatures, 1.0)[:, None]
    g = _gumbel(_bits(k1[:, None], k2[:, None], codes))
    return torch.where(sampled[:, None], z + g, z).argmax(-1)


def draw_pruned(logits: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor,
                temperatures: torch.Tensor) -> torch.Tensor:
    """The same draw as ``draw_full``, with float64 scores only for the tokens that can
    still win: those within CUT of the top token's score, and those whose hash bits allow
    a noise above CUT."""
    out = logits.argmax(-1)
    rows = (temperatures > 0).nonzero().flatten()
    if rows.numel() == 0:
        return out
    lg, t, a, b, top = logits[rows], temperatures[rows], k1[rows], k2[rows], out[rows]
    s_top = lg.gather(1, top[:, None])[:, 0].double() / t + noise(a, b, top)
    floor = t * (s_top - CUT)
    near = lg >= (floor - _MARGIN * (1.0 + floor.abs()))[:, None]
    lucky = _lucky(a, b, lg.shape[-1])
    r, cols = (near | lucky).nonzero(as_tuple=True)
    s = lg[r, cols].double() / t[r] + noise(a[r], b[r], cols)
    best = torch.full((len(rows),), -math.inf, dtype=torch.float64).scatter_reduce(
        0, r, s, "amax")
    out[rows] = torch.full((len(rows),), lg.shape[-1]).scatter_reduce(
        0, r, torch.where(s == best[r], cols, lg.shape[-1]), "amin")
    return out


def _mix32_u32(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``_mix32_`` on uint32 arrays, whose products wrap modulo 2**32 by themselves: the
    same integers with half the memory traffic and no masking (``t``: scratch)."""
    np.right_shift(x, 16, out=t)
    x ^= t
    x *= np.uint32(0x7FEB352D)
    np.right_shift(x, 15, out=t)
    x ^= t
    x *= np.uint32(0x846CA68B)
    np.right_shift(x, 16, out=t)
    x ^= t
    return x


_VOCAB_CODES_U32: dict = {}


def _lucky(k1: torch.Tensor, k2: torch.Tensor, size: int) -> torch.Tensor:
    """Which (row, token) hash bits allow a noise above CUT: ``_bits(k1, k2, codes) >=
    BITS_AT_CUT`` for every token of the vocabulary, in uint32 (the CPU sampler's largest
    cost after the model: every row and token hashed at every step)."""
    if size not in _VOCAB_CODES_U32:
        _VOCAB_CODES_U32[size] = vocab_codes(size, "cpu").numpy().astype(np.uint32)
    x = _VOCAB_CODES_U32[size][None, :] ^ k1.numpy().astype(np.uint32)[:, None]
    _mix32_u32(x, np.empty_like(x))
    x ^= k2.numpy().astype(np.uint32)[:, None]
    return torch.from_numpy(x >= np.uint32(BITS_AT_CUT))


def _keyed_full(logits, seeds, steps, temperatures, codes) -> torch.Tensor:
    k1, k2 = row_keys(seeds, steps)
    return draw_full(logits, k1, k2, temperatures, codes)


_COMPILED: dict = {}


def draw(logits: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
         temperatures: torch.Tensor, compiled: bool | None = None) -> torch.Tensor:
    """Row b's token: Gumbel-max under (seeds[b], steps[b]) at temperatures[b] (0: greedy).

    ``logits`` [B, V]; the other arguments are [B] tensors on its device (int64, int64,
    float64). CPU: ``draw_pruned``; other devices: ``draw_full``, compiled on CUDA unless
    ``compiled=False`` (eager, with a warning, if compiling fails). No host
    synchronisation off the CPU."""
    if logits.device.type == "cpu":
        return draw_pruned(logits, *row_keys(seeds, steps), temperatures)
    codes = vocab_codes(logits.shape[-1], logits.device)
    if compiled is None:
        compiled = logits.device.type == "cuda"
    return (_compiled_full() if compiled else _keyed_full)(logits, seeds, steps, temperatures,
                                                           codes)


def _compiled_full():
    if "full" not in _COMPILED:
        fn = torch.compile(_keyed_full, dynamic=False)

        def guarded(*args):
            try:
                return fn(*args)
            except Exception as err:  # noqa: BLE001 - a compiler failure: go on eager, same draws
                warnings.warn(f"compiling the sampler failed ({err!r}); sampling eager")
                _COMPILED["full"] = _keyed_full
                return _keyed_full(*args)

        _COMPILED["full"] = guarded
    return _COMPILED["full"]


def draw_rows(logits: torch.Tensor, seeds, steps, temperatures,
              compiled: bool | None = None) -> torch.Tensor:
    """``draw`` from Python values (``steps`` an int for every row, or one per row)."""
    device, n = logits.device, logits.shape[0]
    steps = [int(steps)] * n if isinstance(steps, int) else [int(s) for s in steps]
    return draw(logits, check_seeds(seeds).to(device), torch.tensor(steps, device=device),
                torch.tensor([float(t) for t in temperatures], dtype=torch.float64,
                             device=device), compiled)


class SeededLogitsProcessor:
    """A logits processor for HF ``generate``: row b's token is ``draw`` under seeds[b] at
    temperatures[b], step = the number of calls so far; the returned scores are -inf except
    at that token, so greedy decoding takes exactly it."""

    def __init__(self, temperatures: list[float], seeds: list[int]):
        if len(temperatures) != len(seeds):
            raise ValueError("one temperature per seed")
        self.temperatures = torch.tensor([float(t) for t in temperatures], dtype=torch.float64)
        self.seeds = check_seeds(seeds)
        self.step = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        device = scores.device
        steps = torch.full((scores.shape[0],), self.step, dtype=torch.long, device=device)
        chosen = draw(scores, self.seeds.to(device), steps, self.temperatures.to(device))
        self.step += 1
        out = torch.full_like(scores, -math.inf)
        out[torch.arange(scores.shape[0], device=device), chosen] = 0.0
        return out

"""One colour scale per metric, fixed once for a whole suite and passed to every render.

A token's colour must mean the same thing in every response and at every training step,
or steps cannot be compared by eye. So the scale is computed once from the whole suite's
per-token table (a high quantile of |value|: a handful of extreme tokens must not wash
out the rest) and then handed to every render; values beyond it are clipped to the end
colour and the legend says so. A scale fitted to one rollout is available as an option
for looking inside a quiet response, and is labelled as such; a page that sees a single
table (one checkpoint) uses the fixed book-wide scale ``FIXED`` instead.

Signed metrics use a diverging palette centred on 0 (ColorBrewer RdBu: red negative,
blue positive); non-negative ones a sequential palette from white (ColorBrewer Purples).
``log`` is a symmetric log: linear within ``linthresh`` of 0, logarithmic beyond, so
small and large values both stay visible.
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlprobe_nb.render.metrics import metric, metric_values

DIVERGING = ["#b2182b", "#d6604d", "#f4a582", "#fddbc7", "#f7f7f7",
             "#d1e5f0", "#92c5de", "#4393c3", "#2166ac"]
SEQUENTIAL = ["#ffffff", "#efedf5", "#dadaeb", "#bcbddc", "#9e9ac8",
              "#807dba", "#6a51a3", "#54278f", "#3f007d"]
MISSING = "#dddddd"  # a token without a value (e.g. a NaN from a filtered pair)
TRANSFORMS = ("linear", "log")


def _anchors(palette: list[str]) -> np.ndarray:
    return np.array([[int(c[i:i + 2], 16) for i in (1, 3, 5)] for c in palette], dtype=np.float64)


_ANCHORS = {True: _anchors(DIVERGING), False: _anchors(SEQUENTIAL)}


@dataclass(frozen=True)
class ColourScale:
    """Maps a metric's values to colours: ``[-vmax, vmax]`` (signed) or ``[0, vmax]``."""

    metric: str
    vmax: float
    transform: str = "linear"
    linthresh: float | None = None  # for "log": the linear range around 0 (default vmax/100)
    source: str = ""  # how vmax was chosen, shown in the legend

    def __post_init__(self):
        metric(self.metric)
        if not np.isfinite(self.vmax) or self.vmax <= 0:
            raise ValueError(f"vmax must be positive and finite, got {self.vmax}")
        if self.transform not in TRANSFORMS:
            raise ValueError(f"transform {self.transform!r} not in {TRANSFORMS}")

    @property
    def signed(self) -> bool:
        return metric(self.metric).signed

    @property
    def _c(self) -> float:
        return self.linthresh if self.linthresh else self.vmax / 100.0

    def with_options(self, **changes) -> "ColourScale":
        return dataclasses.replace(self, **changes)

    def position(self, values) -> np.ndarray:
        """Each value's place on the colour bar: in [-1, 1] when signed, else [0, 1]."""
        v = np.asarray(values, dtype=np.float64)
        lo = -self.vmax if self.signed else 0.0
        v = np.clip(v, lo, self.vmax)
        if self.transform == "linear":
            return v / self.vmax
        c = self._c
        return np.sign(v) * np.log1p(np.abs(v) / c) / np.log1p(self.vmax / c)

    def value_at(self, position) -> np.ndarray:
        """The inverse of :meth:`position` (for legend ticks)."""
        t = np.asarray(position, dtype=np.float64)
        if self.transform == "linear":
            return t * self.vmax
        c = self._c
        return np.sign(t) * c * np.expm1(np.abs(t) * np.log1p(self.vmax / c))

    def rgb(self, values) -> np.ndarray:
        """(n, 3) uint8 colours; NaN values get the grey ``MISSING``."""
        values = np.atleast_1d(np.asarray(values, dtype=np.float64))
        t = self.position(values)
        anchors = _ANCHORS[self.signed]
        u = (t + 1.0) / 2.0 if self.signed else t
        x = np.nan_to_num(u, nan=0.0) * (len(anchors) - 1)
        i = np.clip(np.floor(x).astype(int), 0, len(anchors) - 2)
        frac = (x - i)[:, None]
        out = anchors[i] * (1 - frac) + anchors[i + 1] * frac
        out = np.rint(out).astype(np.uint8)
        out[np.isnan(values)] = _anchors([MISSING])[0].astype(np.uint8)
        return out

    def colours(self, values) -> list[str]:
        """``#rrggbb`` for each value."""
        return ["#%02x%02x%02x" % tuple(c) for c in self.rgb(np.atleast_1d(values))]

    def text_colours(self, values) -> list[str]:
        """Black or white, whichever reads better on each value's colour."""
        rgb = self.rgb(np.atleast_1d(values)).astype(np.float64)
        luminance = rgb @ np.array([0.299, 0.587, 0.114])
        return np.where(luminance < 110, "#ffffff", "#000000").tolist()

    def describe(self) -> str:
        m = metric(self.metric)
        rng = f"±{self.vmax:.3g}" if m.signed else f"0 … {self.vmax:.3g}"
        extra = ", symmetric log" if self.transform == "log" else ""
        return f"{m.short} on {rng}{extra}; beyond it clipped. {self.source}".strip()

    def legend_html(self, ticks: int = 5) -> str:
        """A colour bar with tick values and the metric named in words (inline CSS)."""
        lo = -1.0 if self.signed else 0.0
        stops = np.linspace(lo, 1.0, 21)
        colours = self.colours(self.value_at(stops))
        gradient = ", ".join(colours)
        labels = "".join(
            f'<span>{v:+.3g}</span>' if self.signed else f'<span>{v:.3g}</span>'
            for v in self.value_at(np.linspace(lo, 1.0, ticks)))
        return (
            '<div class="rp-legend" style="font:12px sans-serif;margin:4px 0 8px 0;max-width:640px">'
            f'<div>{html.escape(metric(self.metric).label)}</div>'
            f'<div style="height:12px;border:1px solid #999;background:linear-gradient(to right, {gradient})"></div>'
            f'<div style="display:flex;justify-content:space-between">{labels}</div>'
            f'<div style="color:#555">{html.escape(self.describe())}</div></div>')


# A scale needing no table: full colour at these values on every page of every suite
# (|Δlogp| = 2 nats is a factor e^2 ~ 7 in probability). For a page that sees one table.
FIXED = {"dlogp": 2.0, "kl_ref_ckpt": 1.0, "kl_ckpt_ref": 1.0, "js": 0.35, "dentropy": 1.0}


def fixed_scale(metric_name: str = "dlogp", transform: str = "linear") -> ColourScale:
    """The book-wide constant scale for ``metric_name`` (``FIXED``)."""
    return ColourScale(metric_name, FIXED[metric_name], transform=transform,
                       source="A fixed scale, the same on every page of the book.")


def fit_scale(values, metric_name: str, quantile: float = 0.99, transform: str = "linear",
              source: str | None = None) -> ColourScale:
    """A scale whose end is the ``quantile`` of |values| (NaNs ignored)."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v)]
    top = float(np.quantile(v, quantile)) if v.size else 0.0
    if top <= 0:  # an all-zero selection (e.g. the reference against itself)
        top = float(v.max()) if v.size and v.max() > 0 else 1e-6
    if source is None:
        source = f"End at the {quantile:g} quantile of |{metric(metric_name).short}| over {v.size:,} tokens."
    return ColourScale(metric_name, top, transform=transform, source=source)


def shared_scale(tokens: pd.DataFrame, metric_name: str = "dlogp", quantile: float = 0.99,
                 transform: str = "linear") -> ColourScale:
    """The suite-wide scale: fitted once on every row of ``tokens`` (all checkpoints, all
    rollouts) except first-token rows, which repeat across a problem's rollouts."""
    rows = tokens[~tokens["first_token"]] if "first_token" in tokens.columns else tokens
    values = metric_values(rows, metric_name)
    n = np.isfinite(values).sum()
    source = (f"Shared by every checkpoint and rollout here: the {quantile:g} quantile of "
              f"|{metric(metric_name).short}| over {n:,} tokens of {rows.rollout_id.nunique():,} rollouts "
              f"at {rows.checkpoint.nunique()} checkpoint{'' if rows.checkpoint.nunique() == 1 else 's'}.")
    return fit_scale(values, metric_name, quantile, transform, source)

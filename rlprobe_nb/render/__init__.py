"""Per-token divergence drawn inline: a colour scale shared by a whole suite, a response as
coloured tokens with tooltips, small charts, the case-study page and the live viewer.
Everything renders to self-contained HTML (inline CSS and SVG, one small inline script that
places tooltips, no network)."""

from rlprobe_nb.render.colour_scale import (
           ColourScale,
           fit_scale,
           fixed_scale,
           shared_scale,
)
from rlprobe_nb.render.metrics import DEFAULT_METRIC, METRICS, metric_values
from rlprobe_nb.render.tokens_html import make_decoder, response_html

__all__ = ["ColourScale", "fit_scale", "fixed_scale", "shared_scale", "DEFAULT_METRIC", "METRICS", "metric_values",
           "make_decoder", "response_html"]

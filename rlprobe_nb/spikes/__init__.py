"""Spikes: tokens at which a checkpoint departs from the reference far more than
comparable tokens do, found with a calibrated test, signed, and followed across steps.

  statistic      the tested divergence, the sign of a departure, where probability moved
  null           the null model: its assumptions, two components, one statistic; the
                 internal null (cross-fitting by problem on the checkpoint's own departures)
  external       the external null: the placebo checkpoint at the same step
  conditional    robust conditional location and scale of one component given covariates
  tail           a null distribution: empirical bulk, exponential tail
  multiplicity   one test per distinct context, Benjamini–Hochberg, a minimum effect
  detector       ``detect``: all of the above per checkpoint, with the null it was given
  plants         changes planted in real token tables, every metric recomputed: power
  onsets         when each token category and ground-truth label starts to change
  across_steps   series of a context over steps, onset, persistence class
  regions        adjacent spikes merged into spans of text
  table          the ``spikes`` table
  chapter        chapter 05's tables, computed once and reused (``tables.derived``)
  charts         calibration, raster, onset heatmap, new persistent spikes per step
  simulate       synthetic tables with planted spikes (calibration and power checks)
  narrative      the chapter's sentences, read from its tables
  verdicts       the chapter's finding and the verdict under each comparison it sets up
"""

from rlprobe_nb.spikes.detector import detect, spike_rates, summary  # noqa: F401

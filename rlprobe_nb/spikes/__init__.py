"""Spikes: tokens at which a checkpoint departs from the reference far more than
comparable tokens do, found with a calibrated test, signed, and followed across steps.

  statistic      the tested divergence, the sign of a departure, where probability moved
  null           the null model: its assumptions, two components, cross-fitting by problem
  conditional    robust conditional location and scale of one component given covariates
  tail           a null distribution: empirical bulk, exponential tail
  multiplicity   one test per distinct context, Benjamini–Hochberg, a minimum effect
  detector       ``detect``: all of the above per checkpoint
  across_steps   series of a context over steps, onset, persistence class
  regions        adjacent spikes merged into spans of text
  table          the ``spikes`` table
  charts         calibration, raster, onset heatmap, new persistent spikes per step
  simulate       synthetic tables with planted spikes (calibration and power checks)
"""

from rlprobe_nb.spikes.detector import detect, spike_rates, summary  # noqa: F401

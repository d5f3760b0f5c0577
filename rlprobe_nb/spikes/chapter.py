"""Chapter 05's tables: the tests, the spikes and their regions, the plant checks, the
calibration p-values and the departures by label, each computed once and reused while
nothing it depends on changes (``tables.derived``).

``SETTINGS_OF`` names the notebook parameters the rows of each table depend on, so a
parameter that only changes what is shown (``n_top``) refuses nothing, and one that
changes the plant check alone (``plant_runs``) leaves the spikes as they are.
"""

from __future__ import annotations

from typing import Mapping

import pandas as pd

from rlprobe_nb.spikes import charts, detector, external, simulate, table
from rlprobe_nb.suite import params
from rlprobe_nb.tables import derived, lineage, provenance, suite_tables

PRODUCER = "notebooks/05_spikes"
_TEST = ("q", "min_effect", "divergence", "seed")
SETTINGS_OF = {
    "spike_tests": _TEST, "spikes": _TEST, "spike_regions": _TEST,
    "spike_plants": _TEST + ("plants_per_size", "plant_runs"),
    "spike_plant_ranks": ("divergence", "seed", "plants_per_size"),
    "spike_placebo_plants": _TEST + ("plants_per_size", "plant_runs"),
    "spike_calibration": ("q", "divergence", "seed"),
    "spike_label_departures": ("group", "seed"),
    "spike_placebo_departures": ("group", "seed"),
}


def chapter_tables(P: params.Params, tokens: pd.DataFrame, nulls_used: pd.DataFrame,
                   parameters: dict, overwrite: bool = False) -> derived.ChapterTables:
    """The chapter's tables, keyed by the token tables of the checkpoints and of the
    placebo run (the external null), the chapter's code and, per table, the
    ``parameters`` (the notebook's, by name) its rows depend on."""
    placebo = lineage.token_shas(P, suite_tables.placebo_pairs(P)) if P.placebos else {}
    manifest = provenance.manifest(P, extra={**parameters, "token_rows": len(tokens),
                                             "nulls": nulls_used.to_dict("records")})
    settings = {name: {k: parameters[k] for k in names} for name, names in SETTINGS_OF.items()}
    return derived.ChapterTables(P, PRODUCER, settings, manifest, inputs=placebo,
                                 overwrite=overwrite)


def tests_table(tokens: pd.DataFrame, suite: str, **detect_kw) -> pd.DataFrame:
    """``detector.detect`` with the columns of ``schemas.SPIKE_TESTS``."""
    return table.to_schema(detector.detect(tokens, **detect_kw), "spike_tests", suite=suite)


def spikes_tables(tokens: pd.DataFrame, tests: pd.DataFrame, vocab: Mapping[int, str] | None,
                  suite: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spikes, spike_regions) with the columns of their schemas (``table.spikes_table``)."""
    spikes, spans = table.spikes_table(tokens, tests, vocab=vocab)
    return table.to_schema(spikes, suite=suite), table.to_schema(spans, "spike_regions")


def placebo_departure_table(placebo: pd.DataFrame, group: str, seed: int) -> pd.DataFrame:
    """The placebo run's own departures from the reference by label and step, as the RLVR
    run's are tabled (``onsets.departure_table``): what optimisation without the reward's
    information changes, and when. Empty where the suite has no placebo run."""
    from rlprobe_nb.spikes import onsets

    if placebo is None or placebo.empty:
        return pd.DataFrame(columns=onsets.DEPARTURE_COLUMNS)
    rows = placebo.reset_index(drop=True)
    return onsets.departure_table(onsets.departures(rows), onsets.labels(rows), group=group,
                                  seed=seed)


def calibration_pvalues(tokens: pd.DataFrame, tests: pd.DataFrame,
                        nulls: Mapping[str, pd.DataFrame], q: float, divergence: str,
                        seed: int) -> pd.DataFrame:
    """The p-values of the calibration checks at the last checkpoint: its real contexts; a
    simulated null table of the same size and typical drift (nothing planted); a real
    table tested against itself, its problems split at random into halves, each the
    external null of the other (the placebo's table where the suite has one)."""
    last = tokens.checkpoint.iloc[-1]
    target = tokens[tokens.checkpoint == last]
    simulated = detector.detect(simulate.null_like(target), q=q, min_effect=0.0,
                                divergence=divergence)
    return charts.pvalues_by_label(**{
        f"{last} (real)": tests[tests.checkpoint == last], "simulated null": simulated,
        **external.halves_by_label(nulls.get(last, target), seed=seed, divergence=divergence)})

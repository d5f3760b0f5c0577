"""Chapters 04 on read every token table of a suite through suite_tables: with none forced
they stop at once naming the 03 runs; a derived table (spikes, aggregates) whose token
tables changed is refused (lineage)."""

import pandas as pd
import pyarrow as pa
import pytest

from rlprobe_nb.suite import params
from test_counterfactuals_table import stub_token_tables

from rlprobe_nb.tables import lineage, storage, suite_tables


def test_nothing_forced_names_the_missing_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    P = params.load("demo")
    with pytest.raises(suite_tables.NothingForcedError) as err:
        suite_tables.read_tokens(P)
    for ckpt in P.checkpoints:
        assert f"-p checkpoint {ckpt}" in str(err.value)


def test_a_derived_table_of_other_token_tables_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))
    P = params.load("demo")
    shas = {"tokens/rlvr_step_1200__vs__dpo": "aaaa"}
    stub_token_tables(monkeypatch, shas)
    schema = pa.schema([("x", pa.int32())])
    lineage.write_derived(P, "spikes", pd.DataFrame({"x": [1, 2]}), schema, {}, {"q": 0.05},
                          "notebooks/05_spikes")
    assert list(lineage.read_derived(P, "spikes").x) == [1, 2]
    shas["tokens/rlvr_step_1200__vs__dpo"] = "bbbb"  # the token table was recomputed since
    with pytest.raises(storage.StaleTableError, match="aaaa -> bbbb.*rerun notebooks/05_spikes"):
        lineage.read_derived(P, "spikes")


def test_accuracy_of_the_demo_suite_comes_from_its_recorded_run():
    acc = suite_tables.accuracy_table(params.load("demo")).set_index("model")
    assert acc.loc["dpo", "step"] == 0 and acc.loc["rlvr_step_1200", "step"] == 1200
    assert (acc.low <= acc.rate).all() and (acc.rate <= acc.high).all()

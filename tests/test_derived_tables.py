"""A chapter's derived tables (chapters 04 and 05, ``tables.derived``): reused with one
line when nothing changed, refused before any work naming what changed (a setting, an
input table, a source file), recomputed with overwrite, and a missing table computed while
the rest are reused (issue 34 item 2)."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pytest

from rlprobe_nb.suite import params
from rlprobe_nb.tables import derived, lineage, schemas, storage

NAMES = ("divergence_test_a", "divergence_test_b")  # keyed on divergence/'s code


@pytest.fixture()
def P(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPROBE_OUT", str(tmp_path))  # no token table: their key has none
    for name in NAMES:
        monkeypatch.setitem(schemas.TABLES, name, pa.schema([("x", pa.int64())]))
    return params.load("demo")


class Computed:
    """A table's computation that counts its calls."""

    def __init__(self, value: int = 1):
        self.value, self.calls = value, 0

    def __call__(self) -> pd.DataFrame:
        self.calls += 1
        return pd.DataFrame({"x": [self.value, self.value + 1]})


def chapter(P, seed=0, inputs=None, overwrite=False) -> derived.ChapterTables:
    return derived.ChapterTables(P, "notebooks/04_divergence", dict.fromkeys(NAMES, {"seed": seed}),
                                 {"suite": P.suite}, inputs=inputs, overwrite=overwrite)


def fill(tables: derived.ChapterTables, value: int = 1) -> list[Computed]:
    computed = [Computed(value) for _ in NAMES]
    for name, compute in zip(NAMES, computed):
        assert list(tables.get(name, compute).x) == [value, value + 1]
    return computed


def test_a_first_run_computes_and_a_second_reuses_in_one_line(P, capsys):
    assert [c.calls for c in fill(chapter(P))] == [1, 1]
    assert "computing its 2 tables" in capsys.readouterr().out
    assert [c.calls for c in fill(chapter(P))] == [0, 0]
    said = capsys.readouterr().out
    assert said.count("reusing ") == 1 and "reusing the 2 tables of notebooks/04_divergence" in said


@pytest.mark.parametrize("change,named", [
    (dict(seed=1), "settings.seed: 0 -> 1"),
    (dict(inputs={"tokens/rlvr_step_400__vs__dpo": "b" * 16}),
     "inputs.tokens/rlvr_step_400__vs__dpo: (absent) -> bbbbbbbbbbbbbbbb"),
])
def test_a_change_is_refused_naming_it_then_recomputed_with_overwrite(P, capsys, change, named):
    fill(chapter(P))
    before = {n: storage.read_manifest(lineage.folder(P, n))["key_sha"] for n in NAMES}
    with pytest.raises(storage.StaleTableError, match="-p overwrite True") as refused:
        chapter(P, **change)
    assert named in str(refused.value), refused.value
    assert {n: storage.read_manifest(lineage.folder(P, n))["key_sha"] for n in NAMES} == before
    capsys.readouterr()
    assert [c.calls for c in fill(chapter(P, overwrite=True, **change), value=5)] == [1, 1]
    said = capsys.readouterr().out
    assert said.startswith("recomputing its 2 tables: computed from other inputs (") and named in said
    assert [c.calls for c in fill(chapter(P, **change), value=5)] == [0, 0]


def test_a_changed_source_file_is_named(P, monkeypatch):
    fill(chapter(P))
    real = lineage.code_hashes

    def edited(P_, patterns):
        out = real(P_, patterns)
        return {**out, "files": {**out["files"], "divergence/summary.py": "0" * 16}}

    monkeypatch.setattr(lineage, "code_hashes", edited)
    with pytest.raises(storage.StaleTableError, match="code.files.divergence/summary.py: .* -> 0{16}"):
        chapter(P)


def test_a_missing_table_is_computed_and_the_rest_reused(P, capsys):
    fill(chapter(P))
    storage.clear_files(lineage.folder(P, NAMES[1]))
    capsys.readouterr()
    assert [c.calls for c in fill(chapter(P))] == [0, 1]
    said = capsys.readouterr().out
    assert f"computing 1 of its 2 tables ({NAMES[1]}); reusing the other 1" in said, said


def test_tables_computed_together_are_got_together(P):
    tables = chapter(P)
    a, b = tables.get(NAMES, lambda: (pd.DataFrame({"x": [1]}), pd.DataFrame({"x": [2]})))
    assert list(a.x) == [1] and list(b.x) == [2]
    with pytest.raises(KeyError, match="did not declare"):
        tables.get("divergence_other", Computed())

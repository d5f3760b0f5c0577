"""Atomic writes, schema-checked parquet, manifests and resumable shards."""

import pandas as pd
import pyarrow as pa
import pytest

from rlprobe_nb import storage

SCHEMA = pa.schema([("id", pa.string()), ("x", pa.float32()), ("ids", pa.list_(pa.int32()))])


def frame(n, start=0):
    return pd.DataFrame({"id": [f"r{i}" for i in range(start, start + n)],
                         "x": [i / 3 for i in range(start, start + n)],
                         "ids": [[i, i + 1] for i in range(start, start + n)]})


def test_failed_write_keeps_old_content(tmp_path):
    target = tmp_path / "a.json"
    storage.atomic_write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with storage.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert storage.read_json(target) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"], "temporary file left behind"


def test_table_roundtrip_with_explicit_types(tmp_path):
    storage.write_table(tmp_path / "t", frame(5), SCHEMA, {"suite": "test"})
    df = storage.read_table(tmp_path / "t")
    assert list(df.id) == [f"r{i}" for i in range(5)]
    assert df.x.dtype == "float32"
    assert storage.read_manifest(tmp_path / "t")["rows"] == 5


def test_schema_mismatch_names_columns(tmp_path):
    with pytest.raises(ValueError, match=r"missing \['ids'\], unexpected \['y'\]"):
        storage.write_table(tmp_path / "t", frame(2).drop(columns="ids").assign(y=1), SCHEMA, {})


def test_table_without_manifest_is_not_a_result(tmp_path):
    storage.write_parquet(tmp_path / "t" / "part-00000.parquet", frame(2), SCHEMA)
    with pytest.raises(FileNotFoundError, match="no complete manifest"):
        storage.read_table(tmp_path / "t")


def test_sharded_table_resumes_and_refuses_other_inputs(tmp_path):
    table = storage.ShardedTable(tmp_path / "s", SCHEMA)
    table.begin("fp1")
    table.write_shard("00000", frame(3))
    again = storage.ShardedTable(tmp_path / "s", SCHEMA)
    again.begin("fp1")
    assert again.done() == {"00000"}
    again.write_shard("00001", frame(2, start=3))
    again.finish({"suite": "test"}, expected=["00000", "00001"])
    df = storage.read_table(tmp_path / "s")
    assert list(df.id) == [f"r{i}" for i in range(5)]
    with pytest.raises(RuntimeError, match="other inputs or parameters"):
        storage.ShardedTable(tmp_path / "s", SCHEMA).begin("fp2")
    fresh = storage.ShardedTable(tmp_path / "s", SCHEMA)
    fresh.begin("fp2", overwrite=True)
    assert fresh.done() == set() and not storage.is_complete(tmp_path / "s")


def test_finish_refuses_missing_shards(tmp_path):
    table = storage.ShardedTable(tmp_path / "s", SCHEMA)
    table.begin("fp")
    table.write_shard("00000", frame(1))
    with pytest.raises(RuntimeError, match="1 shards missing"):
        table.finish({}, expected=["00000", "00001"])

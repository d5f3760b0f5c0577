"""Atomic writes, schema-checked parquet, manifests and resumable shards."""

import pandas as pd
import pyarrow as pa
import pytest

from rlprobe_nb.tables import storage

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
    # the complete table stays in place until the new one is complete and replaces it
    assert fresh.done() == set() and storage.read_manifest(tmp_path / "s")["key"] == {
        "fingerprint": "fp1"}
    fresh.write_shard("00000", frame(1))
    fresh.finish({"suite": "test"}, expected=["00000"])
    assert len(storage.read_table(tmp_path / "s")) == 1


def test_finish_refuses_missing_shards(tmp_path):
    table = storage.ShardedTable(tmp_path / "s", SCHEMA)
    table.begin("fp")
    table.write_shard("00000", frame(1))
    with pytest.raises(RuntimeError, match="1 shards missing"):
        table.finish({}, expected=["00000", "00001"])


def test_tensor_files_round_trip_and_are_safetensors(tmp_path):
    import torch
    from safetensors import safe_open

    g = torch.Generator().manual_seed(0)
    tensors = {"hidden": torch.randn(37, 24, generator=g).to(torch.bfloat16),
               "bias": torch.randn(5, generator=g, dtype=torch.float64)}
    path = storage.write_tensors(tmp_path / "h.safetensors", tensors, {"rollout_ids": '["a"]'})
    back, meta = storage.read_tensors(path)
    assert meta == {"rollout_ids": '["a"]'}
    assert all(torch.equal(back[k], tensors[k]) and back[k].dtype == tensors[k].dtype
               for k in tensors)
    with safe_open(str(path), framework="pt") as f:  # the library reads our files
        assert f.metadata() == meta
        assert torch.equal(f.get_slice("hidden")[3:9], tensors["hidden"][3:9])
        assert torch.equal(f.get_tensor("bias"), tensors["bias"])
    only, _ = storage.read_tensors(path, ["bias"])
    assert list(only) == ["bias"]
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        storage.read_tensors(path, ["nope"])


def test_tensor_file_refusals_leave_nothing_behind(tmp_path):
    import torch

    storage.write_tensors(tmp_path / "x.safetensors", {"a": torch.ones(3)})
    with pytest.raises(TypeError, match="CPU tensors"):
        storage.write_tensors(tmp_path / "x.safetensors", {"a": torch.ones(3, dtype=torch.int64)})
    back, _ = storage.read_tensors(tmp_path / "x.safetensors")
    assert torch.equal(back["a"], torch.ones(3))  # the old file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.safetensors"]
    blob = (tmp_path / "x.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(blob[:-4])
    with pytest.raises(EOFError, match="truncated"):
        storage.read_tensors(tmp_path / "cut.safetensors")


def test_device_tensors_are_streamed_through_host_slices(tmp_path):
    import torch

    real = torch.randn(6, 5, dtype=torch.float32)
    on_device = real.to("meta")  # stands in for a GPU tensor: no host data of its own
    flat = real.reshape(-1)

    def slices(t, step=7):
        assert t is on_device
        return (flat[s:s + step] for s in range(0, flat.numel(), step))

    path = storage.write_tensors(tmp_path / "head.safetensors", {"weight": on_device},
                                 host_slices=slices)
    back, _ = storage.read_tensors(path)
    assert torch.equal(back["weight"], real)
    with pytest.raises(TypeError, match="CPU tensors"):  # a device tensor needs host_slices
        storage.write_tensors(tmp_path / "x.safetensors", {"weight": on_device})
    with pytest.raises(RuntimeError, match="header says"):  # a short stream is refused
        storage.write_tensors(tmp_path / "short.safetensors", {"weight": on_device},
                              host_slices=lambda t: iter([flat[:10]]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head.safetensors"]

"""A table read is verified against its manifest: damaged, missing, copied-in or edited
files are refused with the file named; standard parquet readers open a table folder as it
is; files honour the umask; two writers of one table never mix (issue 9 items 4, 5, 14,
15)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import torch

from rlprobe_nb.tables import storage

SCHEMA = pa.schema([("id", pa.string()), ("x", pa.float32())])
ROOT = Path(__file__).resolve().parents[1]


def frame(n, start=0):
    return pd.DataFrame({"id": [f"r{i}" for i in range(start, start + n)],
                         "x": [i / 3 for i in range(start, start + n)]})


@pytest.fixture()
def sharded(tmp_path):
    table = storage.ShardedTable(tmp_path / "s", SCHEMA, unique=["id"])
    table.begin({"inputs": 1})
    for k in range(3):
        table.write_shard(f"{k:05d}", frame(4, start=4 * k))
    table.finish({"suite": "test"}, ["00000", "00001", "00002"])
    return tmp_path / "s"


def parts(folder):
    return sorted(folder.glob("part-*.parquet"))


def test_intact_table_reads_back(sharded):
    assert list(storage.read_table(sharded).id) == [f"r{i}" for i in range(12)]


def test_deleted_part_is_refused(sharded):
    parts(sharded)[1].unlink()
    with pytest.raises(storage.DamagedTableError, match="listed parts missing"):
        storage.read_table(sharded)


def test_copied_in_part_is_refused(sharded):
    first = parts(sharded)[0]
    (sharded / first.name.replace("00000", "00009")).write_bytes(first.read_bytes())
    with pytest.raises(storage.DamagedTableError, match="not in the manifest"):
        storage.read_table(sharded)


def test_edited_row_count_in_manifest_is_refused(sharded):
    man = json.loads((sharded / storage.MANIFEST).read_text())
    man["rows"] = 11
    (sharded / storage.MANIFEST).write_text(json.dumps(man))
    with pytest.raises(storage.DamagedTableError, match="does not match its checksum"):
        storage.read_table(sharded)


def test_plausible_garbage_in_a_part_is_refused(sharded):
    victim = parts(sharded)[2]
    storage.write_parquet(victim, frame(4, start=100), SCHEMA)  # valid parquet, wrong rows
    with pytest.raises(storage.DamagedTableError, match=victim.name):
        storage.read_table(sharded)


def test_duplicate_rows_across_shards_are_refused(tmp_path):
    table = storage.ShardedTable(tmp_path / "d", SCHEMA, unique=["id"])
    table.begin({"inputs": 1})
    table.write_shard("a", frame(3))
    table.write_shard("b", frame(3, start=2))  # r2 twice
    with pytest.raises(storage.DamagedTableError, match="share their key"):
        table.finish({}, ["a", "b"])


def test_standard_readers_open_the_folder(sharded):
    assert len(pd.read_parquet(sharded)) == 12
    assert ds.dataset(sharded, format="parquet").count_rows() == 12


def test_hidden_state_garbage_is_refused(tmp_path):
    from rlprobe_nb import forcing

    seq = forcing.make_sequence("r#0", "r", [1, 2, 3], [4, 5, 6])
    cache = forcing.HiddenCache(tmp_path / "h")
    cache.begin({"name": "m"})
    cache.save([seq], torch.ones(3, 8), batch_tokens=64)
    (path,) = (tmp_path / "h").glob("h-*.safetensors")
    blob = bytearray(path.read_bytes())
    blob[-8:] = bytes(8)  # same size, plausible floats
    path.write_bytes(bytes(blob))
    with pytest.raises(storage.DamagedTableError, match="checksum"):
        forcing.HiddenCache(tmp_path / "h").rows([seq])


def test_cache_of_another_model_is_refused_with_the_difference(tmp_path):
    from rlprobe_nb import forcing

    cache = forcing.HiddenCache(tmp_path / "h")
    cache.begin({"name": "m", "model": {"files": {"model.safetensors": "aaa"}}})
    cache.release()
    with pytest.raises(storage.StaleTableError, match="model.files.model.safetensors: aaa -> bbb"):
        forcing.HiddenCache(tmp_path / "h").begin(
            {"name": "m", "model": {"files": {"model.safetensors": "bbb"}}})


WRITER = textwrap.dedent("""
    import os, sys, time
    import pandas as pd, pyarrow as pa
    from rlprobe_nb.tables import storage
    os.umask(0o022)
    schema = pa.schema([("id", pa.string())])
    table = storage.ShardedTable(sys.argv[1], schema)
    table.begin({"inputs": 1})
    table.write_shard("a", pd.DataFrame({"id": ["x"]}))
    print("WRITING", flush=True)
    time.sleep(float(sys.argv[2]))
    table.finish({}, ["a"])
    print("DONE", flush=True)
""")


def _writer(folder, hold):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", "import os; os.umask(0o022)\n" + WRITER,
                             str(folder), str(hold)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_files_honour_the_umask(tmp_path):
    proc = _writer(tmp_path / "t", 0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    for path in (tmp_path / "t").iterdir():
        if path.name != storage.LOCK_FILE:
            assert path.stat().st_mode & 0o777 == 0o644, (path.name, oct(path.stat().st_mode))


def test_a_second_writer_is_refused_and_names_the_first(tmp_path):
    first = _writer(tmp_path / "t", 20)
    assert first.stdout.readline().strip() == "WRITING"
    tmp_litter = storage.work_dir(tmp_path / "t") / ".part-z.abc.tmp.parquet"
    tmp_litter.write_bytes(b"in flight")  # the first writer's temporary file
    table = storage.ShardedTable(tmp_path / "t", pa.schema([("id", pa.string())]))
    with pytest.raises(storage.TableBusyError, match=f"pid {first.pid}"):
        table.begin({"inputs": 1})
    assert tmp_litter.exists(), "the refused writer deleted the first one's temp file"
    first.kill()
    first.wait()
    table.begin({"inputs": 1})  # the lock died with its process
    table.release()


def test_the_same_process_may_rewrite_after_an_error(tmp_path):
    """A notebook cell rerun in the same kernel after an exception is not a second writer."""
    table = storage.ShardedTable(tmp_path / "t", SCHEMA)
    table.begin({"inputs": 1})
    again = storage.ShardedTable(tmp_path / "t", SCHEMA)
    assert again.begin({"inputs": 1}) is False
    again.write_shard("a", frame(2))
    again.finish({}, ["a"])
    assert storage.ShardedTable(tmp_path / "t", SCHEMA).begin({"inputs": 1}) is True


# --------------------------------------------------------------- issue 22, items 2 and 6

def test_a_part_of_another_table_is_refused_on_resume_on_finish_and_on_read(tmp_path):
    """Parts of two tables share their names (same units of work, e.g. the same rollouts
    forced through two checkpoints): a part carries its table's key, so a part copied
    from the other table is never adopted."""
    other = storage.ShardedTable(tmp_path / "other", SCHEMA)
    other.begin({"checkpoint": "rlvr_step_800"})
    other.write_shard("00000", frame(2))
    foreign = next(storage.parts_on_disk(other.work).values().__iter__())
    mine = storage.ShardedTable(tmp_path / "mine", SCHEMA)
    mine.begin({"checkpoint": "rlvr_step_400"})
    mine.release()
    (mine.work / foreign.name).write_bytes(foreign.read_bytes())  # the run's own _run.json kept
    resumed = storage.ShardedTable(tmp_path / "mine", SCHEMA)
    with pytest.raises(storage.DamagedTableError, match="belongs to another table"):
        resumed.begin({"checkpoint": "rlvr_step_400"})
    with pytest.raises(storage.DamagedTableError, match=f"{foreign.name} belongs to another"):
        mine.finish({}, ["00000"])  # a run that had begun before the part came in
    assert not (tmp_path / "mine").exists()
    # and in a finished table, a part swapped for the other table's (checksums updated)
    other.finish({}, ["00000"])
    mine = storage.ShardedTable(tmp_path / "mine2", SCHEMA)
    mine.begin({"checkpoint": "rlvr_step_400"})
    mine.write_shard("00000", frame(2))
    mine.finish({}, ["00000"])
    done, theirs = parts(tmp_path / "mine2")[0], parts(tmp_path / "other")[0]
    done.unlink()
    (tmp_path / "mine2" / theirs.name).write_bytes(theirs.read_bytes())
    man = json.loads((tmp_path / "mine2" / storage.MANIFEST).read_text())
    man["parts"][0].update(file=theirs.name, sha256=storage.sha256_of(theirs))
    man["parts_sha256"] = storage.parts_checksum(man["parts"], man["rows"], man["key_sha"])
    (tmp_path / "mine2" / storage.MANIFEST).write_text(json.dumps(man))
    with pytest.raises(storage.DamagedTableError, match="belongs to another table"):
        storage.read_table(tmp_path / "mine2")


def test_an_unfinished_table_is_invisible_to_standard_readers(tmp_path):
    table = storage.ShardedTable(tmp_path / "t", SCHEMA)
    table.begin({"inputs": 1})
    table.write_shard("00000", frame(3))
    assert not (tmp_path / "t").exists()  # nothing a reader could open, yet
    with pytest.raises((FileNotFoundError, OSError)):
        pd.read_parquet(tmp_path / "t")
    table.write_shard("00001", frame(2, start=3))
    table.finish({}, ["00000", "00001"])
    assert len(pd.read_parquet(tmp_path / "t")) == 5 and not table.work.exists()
    # rewriting a complete table: readers see the old one whole until the new one is
    again = storage.ShardedTable(tmp_path / "t", SCHEMA)
    again.begin({"inputs": 2}, overwrite=True)
    again.write_shard("00000", frame(1))
    assert len(pd.read_parquet(tmp_path / "t")) == 5
    again.finish({}, ["00000"])
    assert len(pd.read_parquet(tmp_path / "t")) == 1


def test_a_part_removed_with_its_manifest_entry_and_totals_fixed_is_refused(sharded):
    man = json.loads((sharded / storage.MANIFEST).read_text())
    gone = man["parts"].pop(1)
    (sharded / gone["file"]).unlink()
    man["rows"] -= gone["rows"]
    man["shards"] -= 1
    (sharded / storage.MANIFEST).write_text(json.dumps(man))
    with pytest.raises(storage.DamagedTableError, match="part list does not match its checksum"):
        storage.read_table(sharded)


def test_a_truncated_part_is_refused_by_name(sharded):
    part = parts(sharded)[1]
    part.write_bytes(part.read_bytes()[:-40])
    with pytest.raises(storage.DamagedTableError, match=part.name):
        storage.read_table(sharded)
    # and one left in a run's working folder, found on resume
    table = storage.ShardedTable(sharded.parent / "r", SCHEMA)
    table.begin({"inputs": 1})
    table.write_shard("00000", frame(2))
    table.release()
    left = parts(table.work)[0]
    left.write_bytes(left.read_bytes()[:-40])
    with pytest.raises(storage.DamagedTableError, match=f"{left.name} cannot be read"):
        storage.ShardedTable(sharded.parent / "r", SCHEMA).begin({"inputs": 1})


@pytest.mark.parametrize("damage", ["header", "empty", "short"])
def test_a_hidden_state_shard_with_a_damaged_header_is_refused_by_name(tmp_path, damage):
    """Issue 44 item 8: a damaged or empty header gave a bare SafetensorError, no path."""
    from rlprobe_nb import forcing

    seq = forcing.make_sequence("r#0", "r", [1, 2, 3], [4, 5, 6])
    cache = forcing.HiddenCache(tmp_path / "h")
    cache.begin({"name": "m"})
    cache.save([seq], torch.ones(3, 8), batch_tokens=64)
    (path,) = (tmp_path / "h").glob("h-*.safetensors")
    blob = path.read_bytes()
    size = int.from_bytes(blob[:8], "little")
    if damage == "header":
        blob = blob[:8] + b"{" + b"?" * (size - 1) + blob[8 + size:]
    elif damage == "empty":
        blob = b""
    else:
        blob = blob[:8 + size // 2]
    path.write_bytes(blob)
    with pytest.raises(storage.DamagedTableError, match=rf"{path.name}.*delete") as err:
        forcing.HiddenCache(tmp_path / "h").rows([seq])
    assert str(path) in str(err.value)
    with pytest.raises(storage.DamagedTableError, match=path.name):
        storage.read_tensors(path)
    with pytest.raises(storage.DamagedTableError, match=rf"{path.name}: its header"):
        forcing.HiddenCache(tmp_path / "h").index()  # what a read of part of a shard uses


def test_a_part_removed_with_the_manifest_reforged_by_the_packages_own_routine_is_refused(tmp_path):
    """Issue 44 item 11: a part removed and the manifest re-forged (its list checksum
    recomputed with ``parts_checksum``) was read as 2,334 of 3,862 rows and reused. A token
    table's key says how many rows it holds; the key hashes to the key_sha every part
    carries, so the count cannot be changed without rewriting every part."""
    from rlprobe_nb.tables.keys import key_sha

    table = storage.ShardedTable(tmp_path / "s", SCHEMA, unique=["id"])
    table.begin({"inputs": 1, "settings": {"rows": 12}})
    for k in range(3):
        table.write_shard(f"{k:05d}", frame(4, start=4 * k))
    table.finish({"suite": "test"}, ["00000", "00001", "00002"])
    folder = tmp_path / "s"
    assert len(storage.read_table(folder)) == 12
    man = json.loads((folder / storage.MANIFEST).read_text())
    gone = man["parts"].pop(1)
    (folder / gone["file"]).unlink()
    man["rows"] -= gone["rows"]
    man["shards"] -= 1
    man["parts_sha256"] = storage.parts_checksum(man["parts"], man["rows"], man["key_sha"])
    (folder / storage.MANIFEST).write_text(json.dumps(man))
    with pytest.raises(storage.DamagedTableError, match="lists 8 rows.*computed to hold 12"):
        storage.read_table(folder)
    man["key"]["settings"]["rows"] = 8  # the key edited too: it no longer hashes to key_sha
    (folder / storage.MANIFEST).write_text(json.dumps(man))
    with pytest.raises(storage.DamagedTableError, match="does not hash to its key_sha"):
        storage.read_table(folder)
    man["key_sha"] = key_sha(man["key"])  # and key_sha: the parts carry the old one
    man["parts_sha256"] = storage.parts_checksum(man["parts"], man["rows"], man["key_sha"])
    (folder / storage.MANIFEST).write_text(json.dumps(man))
    with pytest.raises(storage.DamagedTableError, match="belongs to another table"):
        storage.read_table(folder)


def test_a_token_tables_key_names_its_rows():
    from rlprobe_nb import forcing

    seqs = forcing.SequenceSet([forcing.make_sequence("r#0", "r", [1, 2, 3], [4, 5, 6, 7])])
    assert forcing.table_key(seqs, "a", "b", 4)["settings"]["rows"] == seqs.n_rows() == 4

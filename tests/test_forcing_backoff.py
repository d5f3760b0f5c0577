"""Out of memory halves the batch and goes on; a half-written table resumes at any batch
size (batch sizes are not part of a table's key: they move rows only by float rounding,
precision.BATCH_TOLERANCE) and its manifest names every size its rows come from (issue 34
item 1); a table computed from other inputs is refused with the difference named (issue 9
items 1 and 11)."""

import pandas as pd
import pytest
import torch

from rlprobe_nb import forcing
from rlprobe_nb.demo.tiny import tiny_llama, tiny_rollouts, tiny_tokenizer
from rlprobe_nb.tables import storage

KW = dict(suite="t", chunk_positions=16, topk=3, device="cpu", compile=False, progress=False)


@pytest.fixture(scope="module")
def world():
    tok = tiny_tokenizer()
    rollouts, problems = tiny_rollouts(tok, n_problems=6, per_problem=3, seed=2)
    seqs = forcing.build_sequences(rollouts, problems, tok, progress=False)
    P = tiny_llama(len(tok), seed=0, init_range=0.5).double()
    Q = tiny_llama(len(tok), seed=1, init_range=0.5).double()
    return seqs, P, Q


def rows(folder):
    return (storage.read_table(folder).sort_values(["rollout_id", "pos"])
            .reset_index(drop=True))


def test_out_of_memory_halves_batch_tokens_and_finishes(world, tmp_path, monkeypatch):
    seqs, P, Q = world
    want = rows(forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q),
                                 tmp_path / "want", batch_tokens=64, **KW))
    real, real_shared = forcing.engine.forward_hidden, forcing.engine.forward_shared

    def too_large(tokens):
        if tokens > 130:  # this "device" holds at most 130 input tokens a batch
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def small_device(model, ids, mask, rows_):
        too_large(ids.numel())
        return real(model, ids, mask, rows_)

    def small_device_shared(model, members, device):
        too_large(len(members) * max(len(s.input_ids) - 1 for s in members))
        return real_shared(model, members, device)

    monkeypatch.setattr(forcing.engine, "forward_hidden", small_device)
    monkeypatch.setattr(forcing.engine, "forward_shared", small_device_shared)
    with pytest.warns(UserWarning, match="out of memory at batch_tokens=1024"):
        out = forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q),
                               tmp_path / "got", batch_tokens=1024, **KW)
    pd.testing.assert_frame_equal(rows(out), want, rtol=1e-6)
    engine = storage.read_manifest(out)["engine"]
    sizes = engine["batch_tokens_tried_this_run"]
    assert sizes[0] == 1024 and sizes[-1] <= 130 and all(b == a // 2 for a, b in zip(sizes, sizes[1:]))
    assert engine["batch_tokens"] == [sizes[-1]]  # every row comes from the size that fit


def test_half_written_table_resumes_at_another_batch_size(world, tmp_path, monkeypatch):
    seqs, P, Q = world
    want = rows(forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q),
                                 tmp_path / "want", batch_tokens=200, **KW))
    real = storage.ShardedTable.write_shard
    written = []

    def crash_after_two(self, key, df):
        if len(written) == 2:
            raise KeyboardInterrupt("killed")
        written.append(key)
        return real(self, key, df)

    monkeypatch.setattr(storage.ShardedTable, "write_shard", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "got",
                         batch_tokens=200, **KW)
    monkeypatch.setattr(storage.ShardedTable, "write_shard", real)
    assert len(storage.parts_on_disk(storage.work_dir(tmp_path / "got"))) == 2
    out = forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "got",
                           batch_tokens=90, **KW)  # another size: continues, nothing twice
    got = rows(out)
    assert not got.duplicated(["rollout_id", "pos"]).any()
    pd.testing.assert_frame_equal(got, want, rtol=1e-6)
    # issue 34 item 1: the manifest names every batch size its rows were computed at
    engine = storage.read_manifest(out)["engine"]
    shards = len(storage.parts_on_disk(out))
    assert engine["batch_tokens"] == [200, 90], engine
    assert engine["shards_by_batch_tokens"] == {"200": 2, "90": shards - 2}, engine


def test_a_hidden_cache_resumed_at_another_batch_size_names_both(world, tmp_path, monkeypatch):
    """A pair read from a cache that two runs filled at two batch sizes says so: its rows
    depend on the batches the cached states were computed in (issue 34 item 1)."""
    seqs, P, Q = world
    real = forcing.HiddenCache.save
    saved = []

    def crash_after_one(self, members, hidden, batch_tokens):
        if saved:
            raise KeyboardInterrupt("killed")
        saved.append(members)
        return real(self, members, hidden, batch_tokens)

    monkeypatch.setattr(forcing.HiddenCache, "save", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        forcing.forward_to_cache(seqs, forcing.Side("Q", Q, cache_dir=tmp_path / "hQ"),
                                 batch_tokens=200, **KW)
    monkeypatch.setattr(forcing.HiddenCache, "save", real)
    forcing.forward_to_cache(seqs, forcing.Side("Q", Q, cache_dir=tmp_path / "hQ"),
                             batch_tokens=90, **KW)
    out = forcing.run_checkpoint(seqs, forcing.Side("P", P), forcing.Side("Q", cache_dir=tmp_path / "hQ"),
                                 tmp_path / "t", batch_tokens=64, **KW)
    engine = storage.read_manifest(out)["engine"]
    assert engine["batch_tokens"] == [64], engine
    cached = next(side for side in engine["sides"] if side["name"] == "Q")
    assert cached["source"] == "cache" and cached["batch_tokens"] == [200, 90], cached


def test_table_of_other_inputs_is_refused_naming_the_difference(world, tmp_path):
    seqs, P, Q = world
    folder = forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "t",
                              batch_tokens=200, key={"weights": "a"}, **KW)
    stamp = sorted(p.stat().st_mtime_ns for p in folder.glob("part-*"))
    # same inputs (another batch size): reused as it is, nothing recomputed
    assert forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), folder,
                            batch_tokens=64, key={"weights": "a"}, **KW) == folder
    assert sorted(p.stat().st_mtime_ns for p in folder.glob("part-*")) == stamp
    with pytest.raises(storage.StaleTableError, match="topk: 3 -> 2"):
        forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), folder,
                         batch_tokens=200, key={"weights": "a"}, **{**KW, "topk": 2})
    with pytest.raises(storage.StaleTableError, match="weights: a -> b"):
        forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), folder,
                         batch_tokens=200, key={"weights": "b"}, **KW)
    # with the option that overwrites: recomputed under the new key
    forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), folder,
                     batch_tokens=200, key={"weights": "b"}, overwrite=True, **KW)
    assert storage.read_manifest(folder)["key"]["weights"] == "b"


def test_a_cache_written_before_batch_sizes_were_recorded_says_so(world, tmp_path):
    """Caches written by an earlier version of the book hold shards without a batch size:
    they are still read, and the manifest calls their size unrecorded."""
    import hashlib

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    seqs, P, Q = world
    forcing.forward_to_cache(seqs, forcing.Side("Q", Q, cache_dir=tmp_path / "hQ"),
                             batch_tokens=200, **KW)
    old = sorted((tmp_path / "hQ").glob("h-*.safetensors"))[0]
    with safe_open(str(old), framework="pt") as f:
        meta = {k: v for k, v in f.metadata().items() if k != "batch_tokens"}
    save_file(load_file(old), old, metadata=meta)
    sha = hashlib.sha256(old.read_bytes()).hexdigest()[:16]
    old.rename(old.with_name(f"{old.name.split('.')[0]}.{sha}.safetensors"))
    out = forcing.run_checkpoint(seqs, forcing.Side("P", P), forcing.Side("Q", cache_dir=tmp_path / "hQ"),
                                 tmp_path / "t", batch_tokens=64, **KW)
    cached = next(s for s in storage.read_manifest(out)["engine"]["sides"] if s["name"] == "Q")
    assert cached["batch_tokens"] == [200, "unrecorded"], cached


def test_overwrite_replaces_a_cache_of_another_setting(world, tmp_path):
    """A forwarded model's cache made by other weights (or other code) is refused, naming
    the difference, and replaced with overwrite=True: the option the message names."""
    seqs, P, Q = world
    cache = tmp_path / "hQ"
    forcing.forward_to_cache(seqs, forcing.Side("Q", Q, cache_dir=cache, identity={"weights": "a"}),
                             batch_tokens=200, **KW)
    changed = forcing.Side("Q", Q, cache_dir=cache, identity={"weights": "b"})
    with pytest.raises(storage.StaleTableError, match="model.weights: a -> b.*overwrite=True"):
        forcing.run_pair(seqs, forcing.Side("P", P), changed, tmp_path / "t", batch_tokens=200, **KW)
    forcing.run_pair(seqs, forcing.Side("P", P), changed, tmp_path / "t", batch_tokens=200,
                     overwrite=True, **KW)
    assert forcing.HiddenCache(cache).identity()["model"] == {"weights": "b"}

"""Out of memory halves the batch and goes on; a half-written table resumes at any batch
size (batch sizes are not part of a table's key: rows are batch-invariant within float
rounding); a table computed from other inputs is refused with the difference named
(issue 9 items 1 and 11)."""

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
    sizes = storage.read_manifest(out)["engine"]["batch_tokens"]
    assert sizes[0] == 1024 and sizes[-1] <= 130 and all(b == a // 2 for a, b in zip(sizes, sizes[1:]))


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

"""A run killed midway (SIGKILL of a real subprocess), rerun, yields exactly the rows of an
uninterrupted run, none twice; the hidden-state cache resumes too."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd

from rlprobe_nb.tables import storage

CHILD = textwrap.dedent("""
    import sys, time
    import torch
    from rlprobe_nb import forcing
    from rlprobe_nb.tables import storage
    from rlprobe_nb.demo.tiny import tiny_llama, tiny_rollouts, tiny_tokenizer
    out, slow = sys.argv[1], float(sys.argv[2])
    torch.set_num_threads(1)
    if slow:  # make each shard take a while so the parent can kill us mid-run
        write = storage.ShardedTable.write_shard
        def slow_write(self, key, df):
            time.sleep(slow)
            return write(self, key, df)
        storage.ShardedTable.write_shard = slow_write
    tok = tiny_tokenizer()
    rollouts, problems = tiny_rollouts(tok, n_problems=8, per_problem=4, seed=1)
    seqs = forcing.build_sequences(rollouts, problems, tok, progress=False)
    P = tiny_llama(len(tok), seed=0, init_range=0.5)
    Q = tiny_llama(len(tok), seed=1, base=P, perturb=0.01)
    forcing.run_pair(seqs, forcing.Side("P", P, tok, out + "/hidden_P"),
                     forcing.Side("Q", Q, tok, out + "/hidden_Q"), out + "/tokens",
                     suite="t", batch_tokens=120, chunk_positions=16, topk=3,
                     compile=False, progress=False)
    print("DONE")
""")


def _start(tmp: Path, out: Path, slow: float) -> subprocess.Popen:
    script = tmp / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, str(script), str(out), str(slow)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values(["rollout_id", "pos"]).reset_index(drop=True)


def test_killed_run_resumes_to_exactly_the_uninterrupted_rows(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    ref = _start(tmp_path, full, 0.0)
    victim = _start(tmp_path, killed, 0.4)
    shards = storage.work_dir(killed / "tokens")  # where a run writes until it is complete
    deadline = time.time() + 120
    while len(list(shards.glob("part-*.parquet"))) < 3:
        assert victim.poll() is None, victim.communicate()[1][-2000:]
        assert time.time() < deadline, "child wrote no shards in time"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    written = len(list(shards.glob("part-*.parquet")))
    assert victim.returncode == -signal.SIGKILL
    assert not (killed / "tokens").exists()  # unfinished: nothing a reader could take for a result
    out, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err[-2000:]
    n_batches = storage.read_manifest(full / "tokens")["shards"]
    assert 3 <= written < n_batches, (written, n_batches)

    rerun = _start(tmp_path, killed, 0.0)
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0 and "DONE" in out, err[-2000:]
    want = _sorted(storage.read_table(full / "tokens"))
    got = _sorted(storage.read_table(killed / "tokens"))
    assert not got.duplicated(["rollout_id", "pos"]).any()
    pd.testing.assert_frame_equal(got, want)
    man = storage.read_manifest(killed / "tokens")
    assert man["rows"] == len(want)
    assert man["engine"]["batches_computed_this_run"] == n_batches - written
    # the hidden caches are complete and identical in content
    for side in ("hidden_P", "hidden_Q"):
        a = sorted(p.name for p in (full / side).glob("h-*.safetensors"))
        b = sorted(p.name for p in (killed / side).glob("h-*.safetensors"))
        assert a == b and (killed / side / "index.json").exists()

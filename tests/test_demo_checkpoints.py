"""The shipped demo suite: its eleven adapters (the supervised reference, five RLVR and five
placebo checkpoints) load on CPU, offline, through the suite registry as the notebooks load
them; they are the recorded run's own, within 0.02 nats of its original bf16 adapters on
forced rollouts; and the repository stays small enough to carry to a GPU whole."""

import subprocess

import pandas as pd
import pytest
import torch

from rlprobe_nb.demo import fidelity, training_run
from rlprobe_nb.problems import arithmetic
from rlprobe_nb.suite import compact_adapters, models, params, paths, prompting
from rlprobe_nb.tables import storage

ADAPTERS = paths.shipped_dir("demo") / "adapters"
TOLERANCE_NATS = 0.02


@pytest.fixture(scope="module")
def demo():
    P = params.load("demo", overrides={"runtime.device": "cpu", "runtime.dtype": "float32"})
    models.load_tokenizer(P.reference, P)  # converting the GGUF (once per cache) is set-up
    return P


@pytest.fixture(scope="module")
def record():
    return training_run.load_recorded_run()


def test_every_model_of_the_suite_is_a_shipped_compact_adapter_of_the_recorded_run(demo, record):
    manifest = record["manifest"]
    names = [demo.reference, *demo.forced]
    assert sorted(manifest["adapters"]) == sorted(names)
    for name in names:
        folder = ADAPTERS / name
        assert compact_adapters.is_compact(folder), name
        assert not (folder / compact_adapters.PEFT_FILE).exists(), name
        original = compact_adapters.metadata(folder)["source_sha256"]
        assert original == manifest["original_adapter_sha256"][name], name
    assert set(demo.placebos) == {n for n in names if n.startswith("placebo_step_")}
    assert {demo.steps[c] for c in demo.placebos} == {demo.steps[c] for c in demo.checkpoints}


def test_the_tracked_tree_stays_under_40_mb():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=paths.REPO_ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = [paths.REPO_ROOT / f for f in listed.stdout.decode().split("\0") if f]
    total = sum(f.stat().st_size for f in files if f.is_file())
    assert total <= 40_000_000, f"tracked files take {total / 1e6:.1f} MB"


def forced_sequences(tok, table: pd.DataFrame) -> dict[str, tuple[list[int], list[int]]]:
    """Each fidelity rollout's prompt (rebuilt from its problem) and its forced tokens."""
    ids = table[table.model == table.model.iloc[0]].sort_values(["rollout", "pos"])
    wanted = {r.split("#")[0] for r in ids.rollout}
    needed = 1 + max(int(p.rsplit("/", 1)[1]) for p in wanted)
    text = {p["unique_id"]: p["problem"] for p in arithmetic.generate_problems("test", needed, 0)}
    return {r: (prompting.prompt_ids(tok, text[r.split("#")[0]]), g.token_id.tolist())
            for r, g in ids.groupby("rollout", sort=True)}


def test_shipped_adapters_force_within_002_nats_of_the_original_run(demo):
    table = pd.read_parquet(training_run.shipped_run_dir() / "fidelity.parquet")
    assert set(table.model) == {demo.reference, *demo.forced}
    seqs = None
    worst = {}
    for name, expected in table.groupby("model", sort=False):
        lm = models.load_model(name, demo)
        seqs = seqs or forced_sequences(lm.tokenizer, table)
        got = fidelity.written_logprobs(lm.model, list(seqs.values()))
        expected = expected.sort_values(["rollout", "pos"])
        gap = (pd.Series([x for g in got for x in g]) - expected.logp_original.to_numpy()).abs()
        worst[name] = float(gap.max())
    assert max(worst.values()) <= TOLERANCE_NATS, worst
    # the shipped models are not the reference everywhere: the comparison can fail
    ref = table[table.model == demo.reference].logp_original.to_numpy()
    last = table[table.model == demo.target].logp_original.to_numpy()
    assert abs(last - ref).max() > 1.0


def test_checkpoint_loads_offline_from_the_caches_and_differs_from_the_reference(demo, monkeypatch):
    from rlprobe_nb.suite import gguf_cache

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")

    def no_dequantizing(*a, **k):  # the slow path (~15 s): the converted cache must serve
        raise AssertionError("the GGUF was dequantized again instead of read from the cache")

    monkeypatch.setattr(gguf_cache, "load_gguf", no_dequantizing)
    ckpt = models.load_model("rlvr_step_1200", demo)
    assert ckpt.provenance["adapter_sha256"] and ckpt.provenance["base"]["base"]["gguf_sha256"]
    ref = models.load_model(demo.reference, demo)
    problems = arithmetic.generate_problems("test", 3, seed=0)
    ids = [prompting.prompt_ids(ckpt.tokenizer, p["problem"]) for p in problems]
    width = min(len(i) for i in ids)
    batch = torch.tensor([i[:width] for i in ids])  # equal lengths: no padding to reason about
    with torch.no_grad():
        logp = torch.log_softmax(ckpt.model(batch).logits.double(), -1)
        logq = torch.log_softmax(ref.model(batch).logits.double(), -1)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # KL(ckpt || reference) per position, nats
    assert torch.isfinite(kl).all() and (kl > -1e-12).all()
    assert kl.max() > 1e-2, f"adapter barely changes the model: max KL {kl.max():.2e}"
    again = models.load_model("rlvr_step_1200", demo)
    with torch.no_grad():
        assert torch.equal(again.model(batch).logits, ckpt.model(batch).logits)


def test_the_recorded_accuracy_shows_the_run_and_its_null(record):
    table = record["accuracy"].set_index("model")
    ref, last, placebo = (table.loc[m] for m in ("dpo", "rlvr_step_1200", "placebo_step_1200"))
    assert last.greedy_low > ref.greedy_high  # the RLVR run separates from the reference
    assert placebo.greedy_low < ref.greedy_high  # the placebo run does not
    assert storage.read_json(training_run.shipped_run_dir() / "manifest.json")["fidelity"][
        "max_abs_logp_gap"] <= TOLERANCE_NATS

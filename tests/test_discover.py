"""discover on every trainer layout, built at test time (``byo_fixtures``): the suite it
writes loads, and every conversion gives back, bit for bit, the weights that were saved."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from byo_fixtures import build
from safetensors.torch import load_file

from rlprobe_nb.suite import discover, params, paths

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return build(tmp_path_factory.mktemp("byo"))


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A params folder holding the demo's suite file (for --like demo) and a cache."""
    (tmp_path / "params" / "demo").mkdir(parents=True)
    shutil.copy2(REPO / "params" / "demo" / "suite.yaml", tmp_path / "params" / "demo")
    shutil.copy2(REPO / "params" / "tulu3" / "suite.yaml", tmp_path / "params" / "suite.yaml")
    (tmp_path / "params" / "tulu3").mkdir()
    shutil.move(tmp_path / "params" / "suite.yaml", tmp_path / "params" / "tulu3")
    monkeypatch.setenv("RLPROBE_PARAMS", str(tmp_path / "params"))
    monkeypatch.setenv("RLPROBE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def run(fx, layout: str, name: str, *extra: str) -> dict:
    args = discover.parse_args([str(fx["runs"] / layout), "--name", name, "--reference",
                                str(fx["ref"]), "--like", "demo", *extra])
    return discover.discover(args)


def tree(folder: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def weights_of(spec: dict) -> dict:
    folder = Path(spec["path"])
    name = "adapter_model.safetensors" if spec["kind"] == "peft" else "model.safetensors"
    return load_file(folder / name)


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("layout, framework, step", [
    ("verl", "verl", 1), ("verl_fsdp1", "verl", 1), ("verl_legacy", "verl", 1),
    ("trl_fsdp", "trl", 1), ("nemo", "nemo-rl", 1), ("openrlhf", "openrlhf", 2)])
def test_conversions_give_back_the_saved_weights(fx, env, layout, framework, step):
    before = tree(fx["runs"] / layout)
    out = run(fx, layout, f"t_{layout}")
    assert out["record"]["framework"] == framework
    P = params.load(f"t_{layout}")
    spec = P.model_spec(f"rlvr_step_{step}")
    assert spec["kind"] == "local" and Path(spec["path"]).is_relative_to(paths.cache_dir())
    assert_same(weights_of(spec), fx["steps"][step])
    assert tree(fx["runs"] / layout) == before  # the run folder is never written


def test_verl_lora_shards_become_the_adapter_that_was_trained(fx, env):
    run(fx, "verl_lora", "t_lora")
    spec = params.load("t_lora").model_spec("rlvr_step_1")
    assert spec["kind"] == "peft" and spec["base"] == "initial"
    want = {k.replace(".default.", "."): v for k, v in fx["lora"].items() if ".lora_" in k}
    assert_same(weights_of(spec), want)
    import json
    config = json.loads((Path(spec["path"]) / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)
    assert config["target_modules"] == ["q_proj", "v_proj"]


def test_a_converted_suite_loads_in_the_book(fx, env):
    """The LoRA checkpoint loads through models.load_model and computes what PEFT's own
    merge of the same adapter computes."""
    from peft import LoraConfig, get_peft_model
    from byo_shards import LORA
    from transformers import AutoModelForCausalLM

    from rlprobe_nb.suite import models

    run(fx, "verl_lora", "t_lora")
    P = params.load("t_lora", overrides={"runtime.device": "cpu"})
    loaded = models.load_model("rlvr_step_1", P)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(fx["ref"]), LoraConfig(**LORA))
    peft_model.load_state_dict(fx["lora"])
    merged = peft_model.merge_and_unload().eval()
    ids = torch.tensor([[1, 5, 9, 20, 33]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, merged(ids).logits)


def test_hf_folders_are_used_as_they_are_and_unfinished_saves_skipped(fx, env, capsys):
    out = run(fx, "trl", "t_trl")
    printed = capsys.readouterr().out
    P = params.load("t_trl")
    assert P.checkpoints == ["rlvr_step_1", "rlvr_step_2"] and P.target == "rlvr_step_2"
    assert P.model_spec("rlvr_step_2") == {"kind": "local",
                                           "path": str(fx["runs"] / "trl" / "checkpoint-2")}
    assert "checkpoint-3: no trainer_state.json" in printed
    assert out["record"]["checkpoints"]["rlvr_step_1"]["step_source"] == \
        "folder name checkpoint-1 = trainer_state.json global_step 1"
    run(fx, "oi", "t_oi")
    assert params.load("t_oi").checkpoints == ["rlvr_step_1", "rlvr_step_2"]
    assert "step_3: no .checkpoint_complete" in capsys.readouterr().out


def test_a_peft_bin_adapter_is_rewritten_as_safetensors(fx, env):
    run_dir = env / "orl_lora"
    hf = run_dir / "global_step1_hf"
    shutil.copytree(fx["runs"] / "trl_lora" / "checkpoint-1", hf)
    saved = load_file(hf / "adapter_model.safetensors")
    (hf / "adapter_model.safetensors").unlink()
    torch.save(saved, hf / "adapter_model.bin")
    args = discover.parse_args([str(run_dir), "--name", "t_bin", "--reference", str(fx["ref"]),
                                "--like", "demo"])
    discover.discover(args)
    spec = params.load("t_bin").model_spec("rlvr_step_1")
    assert spec["kind"] == "peft" and spec["path"] != str(hf)
    assert_same(weights_of(spec), saved)


def test_a_second_run_reuses_its_conversions_and_redoes_a_damaged_one(fx, env, capsys):
    run(fx, "verl", "t_again")
    out = paths.cache_dir() / "runs" / "t_again" / "rlvr_step_1" / "model.safetensors"
    stamp = out.stat().st_mtime_ns
    run(fx, "verl", "t_again", "--force")
    assert "already converted" in capsys.readouterr().out and out.stat().st_mtime_ns == stamp
    out.write_bytes(out.read_bytes()[:-1] + b"\0")  # a damaged output is converted again
    run(fx, "verl", "t_again", "--force")
    assert "already converted" not in capsys.readouterr().out
    assert_same(load_file(out), fx["steps"][1])
    assert not [p for p in out.parent.parent.iterdir() if p.name.startswith(".")]


def test_dry_run_plans_and_writes_nothing(fx, env, capsys):
    run(fx, "openrlhf", "t_dry", "--dry-run")
    plan = capsys.readouterr().out
    assert "use as is (local)" in plan and "DeepSpeed ZeRO-1/2 module -> safetensors" in plan
    assert not (env / "params" / "t_dry").exists() and not (env / "cache").exists()


def test_steps_and_placebo_rules(fx, env, capsys):
    placebo = env / "placebo"
    shutil.copytree(fx["runs"] / "trl" / "checkpoint-1", placebo / "checkpoint-1")
    shutil.copytree(fx["runs"] / "trl" / "checkpoint-2", placebo / "checkpoint-5")
    state = placebo / "checkpoint-5" / "trainer_state.json"
    state.write_text(state.read_text().replace('"global_step": 2', '"global_step": 5'))
    run(fx, "trl", "t_pl", "--placebo", str(placebo))
    P = params.load("t_pl")
    assert P.placebos == ["placebo_step_1"] and P.placebo_for("rlvr_step_1") == "placebo_step_1"
    assert "placebo step 5 has no RLVR checkpoint" in capsys.readouterr().out
    run(fx, "trl", "t_one", "--steps", "1")
    assert params.load("t_one").checkpoints == ["rlvr_step_1"]
    with pytest.raises(discover.DiscoverError, match=r"no checkpoint at steps \[7\]"):
        run(fx, "trl", "t_none", "--steps", "7")


def test_hub_branches_write_the_tulu3_checkpoints(fx, env, monkeypatch):
    """params/tulu3's checkpoint files are what --framework hub writes from its branches."""
    from rlprobe_nb.suite import models

    shipped = sorted((REPO / "params" / "tulu3").glob("rlvr_step_*.yaml"))
    final = max(int(p.stem.split("_")[-1]) for p in shipped)  # the main branch
    branches = ["main", "other"] + [f"step_{p.stem.split('_')[-1]}" for p in shipped
                                    if int(p.stem.split("_")[-1]) != final]
    monkeypatch.setattr(models, "list_revisions", lambda repo: branches)
    args = discover.parse_args(["allenai/Llama-3.1-Tulu-3-8B", "--framework", "hub", "--name",
                                "t_hub", "--reference", str(fx["ref"]), "--like", "tulu3",
                                "--main-step", str(final)])
    discover.discover(args)
    P = params.load("t_hub")
    assert P.checkpoints == sorted((p.stem for p in shipped), key=lambda n: int(n.split("_")[-1]))
    for p in shipped:
        assert P.model_spec(p.stem) == yaml.safe_load(p.read_text())["model"], p.stem
    assert P.target == "rlvr_step_2440"


def test_every_load_of_a_run_file_is_weights_only():
    for module in ("suite/convert_fsdp", "suite/convert_states", "suite/run_convert",
                   "suite/trainer_layouts", "import_rollouts"):
        path = REPO / "rlprobe_nb" / f"{module}.py"
        assert path.is_file(), path
        text = path.read_text()
        assert "weights_only=False" not in text and "import pickle" not in text
        calls = re.findall(r"torch\.load\([^)]*\)", text)
        assert all("weights_only=True" in c for c in calls), (module, calls)


def test_hf_weights_without_a_tokenizer_get_the_references(fx, env):
    """An HF folder saved without its tokenizer (as DeepSpeed-Chat saves) becomes links to
    its weights beside the reference's tokenizer files; the run folder stays as it was."""
    run_dir = env / "orl"
    hf = run_dir / "global_step1_hf"
    shutil.copytree(fx["runs"] / "openrlhf" / "global_step1_hf", hf,
                    ignore=shutil.ignore_patterns("tokenizer*", "chat_template*"))
    before = tree(run_dir)
    args = discover.parse_args([str(run_dir), "--name", "t_shim", "--reference", str(fx["ref"]),
                                "--like", "demo"])
    discover.discover(args)
    spec = params.load("t_shim").model_spec("rlvr_step_1")
    shim = Path(spec["path"])
    assert (shim / "model.safetensors").resolve() == (hf / "model.safetensors").resolve()
    assert (shim / "tokenizer.json").read_bytes() == (fx["ref"] / "tokenizer.json").read_bytes()
    assert_same(load_file(shim / "model.safetensors"), fx["steps"][1])
    assert tree(run_dir) == before


def test_verl_megatron_with_hf_weights_is_used_as_it_is(fx, env):
    actor = env / "meg" / "global_step_2" / "actor"
    shutil.copytree(fx["runs"] / "trl" / "checkpoint-2", actor / "model" / "huggingface",
                    ignore=shutil.ignore_patterns("trainer_state.json"))
    (actor / "model" / "dist_ckpt").mkdir()
    (actor / "ckpt_contents.json").write_text('{"global_step": 2}')
    unfinished = env / "meg" / "global_step_3" / "actor"
    shutil.copytree(actor / "model", unfinished / "model")  # no ckpt_contents.json yet
    out = discover.discover(discover.parse_args([str(env / "meg"), "--name", "t_meg",
                                                 "--reference", str(fx["ref"]), "--like", "demo"]))
    assert params.load("t_meg").model_spec("rlvr_step_2")["path"] == str(actor / "model" / "huggingface")
    assert out["record"]["checkpoints"]["rlvr_step_2"]["step_source"] == \
        "folder name global_step_2 = ckpt_contents.json global_step 2"
    assert [s["folder"] for s in out["record"]["skipped"]] == [str(unfinished)]


@pytest.mark.parametrize("layout", ["verl", "verl_fsdp1"])
def test_the_shards_are_real_and_uneven(fx, layout):
    """The fixture's shard files are DTensor shards of a 2-rank job, the embedding split
    unevenly (an odd vocabulary), so the merge is checked where ranks differ."""
    from rlprobe_nb.suite.convert_fsdp import open_shards

    actor = fx["runs"] / layout / "global_step_1" / "actor"
    states = open_shards(sorted(actor.glob("model_world_size_2_rank_*.pt")))
    embed = [s["model.embed_tokens.weight"] for s in states]
    assert all(type(e).__name__ == "DTensor" for e in embed)
    rows = [e._local_tensor.shape[0] for e in embed]
    assert rows[0] != rows[1] and sum(rows) == embed[0].shape[0] == fx["steps"][1][
        "model.embed_tokens.weight"].shape[0]


def test_tied_weights_are_written_apart(tmp_path):
    """A state dict whose head is its embedding (tie_word_embeddings, kept shared through
    torch.save) is written with both tensors, equal."""
    from rlprobe_nb.suite.convert_fsdp import write_safetensors

    embed = torch.randn(5, 3)
    files = write_safetensors(iter([("model.embed_tokens.weight", embed),
                                    ("lm_head.weight", embed)]), tmp_path)
    got = load_file(files[0])
    assert torch.equal(got["lm_head.weight"], embed) and torch.equal(got["model.embed_tokens.weight"], embed)

"""Generation stops where training stopped: stop tokens declared by the suite, inherited by
checkpoints, part of every model's identity, checked against what an adapter was trained
with, and read by the training script from the GGUF's own metadata."""

import shutil

import pytest
import yaml

from rlprobe_nb.suite import gguf_cache, models, params, paths, stop_tokens

DEMO_STOPS = ["<|im_start|>", "<|im_end|>"]


@pytest.fixture
def demo_copy(tmp_path, monkeypatch):
    """A writable copy of the demo suite's parameters, read through RLPROBE_PARAMS."""
    shutil.copytree(paths.params_dir() / "demo", tmp_path / "demo")
    monkeypatch.setenv("RLPROBE_PARAMS", str(tmp_path))
    suite_file = tmp_path / "demo" / "suite.yaml"

    def edit(change):
        cfg = yaml.safe_load(suite_file.read_text())
        change(cfg)
        suite_file.write_text(yaml.safe_dump(cfg))
        return params.load("demo")
    return edit


def test_the_demo_suite_declares_the_runs_stop_tokens_and_checkpoints_inherit_them():
    P = params.load("demo")
    assert stop_tokens.declared(P.reference, P) == DEMO_STOPS
    for name in P.forced:
        assert stop_tokens.declared(name, P) == DEMO_STOPS
    assert stop_tokens.declared("smollm2", P) is None  # the base declares none of its own


def test_declared_texts_resolve_to_ids_and_an_unknown_text_is_refused():
    P = params.load("demo")
    tok = models.load_tokenizer(P.reference, P)
    assert stop_tokens.ids_of(DEMO_STOPS, tok, "dpo") == [1, 2]
    with pytest.raises(stop_tokens.StopTokenError, match="not a token of its tokenizer"):
        stop_tokens.ids_of(["<|im_stop|>"], tok, "dpo")


def test_a_loaded_model_samples_until_the_declared_tokens():
    from rlprobe_nb.generation.rollouts import eos_ids

    P = params.load("demo", overrides={"runtime.device": "cpu"})
    lm = models.load_model("rlvr_step_1200", P)
    assert eos_ids(lm.model, lm.tokenizer) == [1, 2]
    assert lm.provenance["stop_token_ids"] == [1, 2]
    assert lm.provenance["stop_tokens"] == DEMO_STOPS


def test_the_stop_tokens_are_part_of_the_identity_so_tables_made_with_others_are_stale(demo_copy):
    before = models.model_identity("dpo", demo_copy(lambda cfg: None))
    after = models.model_identity("dpo", demo_copy(
        lambda cfg: cfg["models"]["smollm2"].update(stop_tokens=["<|im_end|>"])))
    assert before["base"]["stop_tokens"] == "model's own EOS"
    assert after["base"]["stop_tokens"] == ["<|im_end|>"]
    assert before != after  # so every table keyed on the reference's identity is stale


def test_a_suite_declaring_other_stops_than_the_adapters_were_trained_with_is_refused(demo_copy):
    P = demo_copy(lambda cfg: cfg["models"]["dpo"].update(stop_tokens=["<|im_end|>"]))
    with pytest.raises(stop_tokens.StopTokenError, match="trained to stop at") as err:
        models.model_identity("rlvr_step_1200", P)
    assert "rlprobe_training.json" in str(err.value) and "stop_tokens" in str(err.value)
    P = demo_copy(lambda cfg: cfg["models"]["dpo"].pop("stop_tokens"))
    with pytest.raises(stop_tokens.StopTokenError, match="declares none"):
        models.model_identity("dpo", P)


def test_a_recorded_run_whose_stops_are_not_the_suites_is_refused(demo_copy):
    from rlprobe_nb.demo import training_run

    assert training_run.load_recorded_run(P=params.load("demo"))["manifest"]["stop_tokens"] == DEMO_STOPS
    P = demo_copy(lambda cfg: cfg["models"]["dpo"].update(stop_tokens=["<|im_end|>"]))
    with pytest.raises(stop_tokens.StopTokenError, match="manifest.json"):
        training_run.load_recorded_run(P=P)


def test_stop_tokens_in_a_spec_must_be_a_list_of_distinct_texts(demo_copy):
    for bad in ("<|im_end|>", [], ["<|im_end|>", "<|im_end|>"], [3]):
        with pytest.raises(params.ParamsError, match="stop_tokens"):
            demo_copy(lambda cfg, b=bad: cfg["models"]["dpo"].update(stop_tokens=b))


def test_the_training_script_takes_eos_from_the_gguf_metadata_and_refuses_a_disagreeing_tokenizer():
    from rlprobe_nb.demo import end_of_turn

    assert gguf_cache.metadata_eos(gguf_cache.demo_gguf_path()) == (2, "<|im_end|>")
    P = params.load("demo")
    tok = models.load_tokenizer("smollm2", P)
    assert end_of_turn.check_tokenizer(tok)["stop_token_ids"] == [2]
    tok.eos_token = "<|im_start|>"  # what transformers 5.17's conversion gives
    with pytest.raises(end_of_turn.EndOfTurnMismatch, match="GGUF's metadata"):
        end_of_turn.check_tokenizer(tok)


def test_stop_tokens_listed_in_another_order_keep_every_identity(demo_copy):
    """Issue 44 item 3: reordering stop_tokens (the same set) made every table stale."""
    before = models.model_identity("rlvr_step_1200", demo_copy(lambda cfg: None))
    after = models.model_identity("rlvr_step_1200", demo_copy(
        lambda cfg: cfg["models"]["dpo"].update(stop_tokens=list(reversed(DEMO_STOPS)))))
    assert before == after


def _adapter_copy(tmp_path, demo_copy):
    adapter = tmp_path / "dpo_copy"
    shutil.copytree(paths.shipped_dir("demo") / "adapters" / "dpo", adapter)
    P = demo_copy(lambda cfg: cfg["models"]["dpo"].update(path=str(adapter)))
    return adapter, P


@pytest.mark.parametrize("content, said", [
    ("{\"stop_tokens\": [\"<|im_", "not valid JSON"),
    ("[\"<|im_end|>\"]", "not the mapping"),
    (b"\xff\xfe{}", "not valid JSON"),
    ("{\"stop_tokens\": \"<|im_start|><|im_end|>\"}", "not a list of token texts")])
def test_a_damaged_training_record_is_refused_naming_the_file(tmp_path, demo_copy, content, said):
    """Issue 44 item 4: a bare JSONDecodeError without the file's name, and a string
    stop_tokens read character by character."""
    adapter, P = _adapter_copy(tmp_path, demo_copy)
    record = adapter / stop_tokens.TRAINING_RECORD
    record.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=said) as err:
        models.model_identity("dpo", P)
    assert str(record) in str(err.value)


@pytest.mark.parametrize("content, said", [("{\"stop", "not valid JSON"), ("[1, 2]", "not the mapping"),
                                           ("{\"stop_tokens\": \"<|im_end|>\"}", "not a list")])
def test_a_damaged_run_manifest_is_refused_naming_the_file(tmp_path, content, said):
    from rlprobe_nb.demo import training_run

    run = tmp_path / "run"
    shutil.copytree(training_run.shipped_run_dir(), run)
    (run / "manifest.json").write_text(content)
    with pytest.raises(ValueError, match=said) as err:
        training_run.load_recorded_run(run, P=params.load("demo"))
    assert str(run / "manifest.json") in str(err.value)

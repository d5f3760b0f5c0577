"""Notebook runs through papermill, as a user runs them: bad parameters fail in the
derive cell, before any model is loaded; the demo chain 01 -> 02 -> 03 runs on small
parameters and its output names what it used."""

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from rlprobe_nb.forcing import plan as forcing_plan
from rlprobe_nb.suite import params, paths
from rlprobe_nb.tables import storage

NB = paths.notebooks_dir()
PAPERMILL = [sys.executable, "-m", "papermill", "--no-progress-bar"]


def papermill(notebook, out, *params, env=None):
    args = [str(NB / notebook), str(out)]
    for key, value in params:
        args += ["-p", key, str(value)]
    return subprocess.run(PAPERMILL + args, capture_output=True, text=True, env=env,
                          cwd=paths.REPO_ROOT, timeout=1800)


def outputs(path) -> str:
    nb = nbformat.read(path, as_version=4)
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text") or out.get("data", {}).get("text/plain", "")
                        or "\n".join(out.get("traceback", [])))
    return "\n".join(map(str, text))


def failing_cell(path) -> str:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return cell.source
    return ""


@pytest.fixture()
def out_env(tmp_path):
    return {**os.environ, "RLPROBE_OUT": str(tmp_path / "out")}


def failed_run_of_03(tmp_path, env, name, value):
    """Run notebook 03 with one bad parameter; it must fail. Returns (outputs, failing cell)."""
    out = tmp_path / "o.ipynb"
    result = papermill("03_teacher_forcing.ipynb", out, (name, value), env=env)
    assert result.returncode != 0, f"03 accepted -p {name} {value}"
    return outputs(out), failing_cell(out)


def test_unknown_checkpoint_fails_before_any_model_loads(tmp_path, out_env):
    text, cell = failed_run_of_03(tmp_path, out_env, "checkpoint", "rlvr_step_1300")
    assert "rlvr_step_1300.yaml" in text and "'rlvr_step_1200'" in text
    assert "params.load(" in cell and "load_model" not in cell
    assert "Loading weights" not in text


def test_misspelled_notebook_parameter_fails(tmp_path, out_env):
    text, _ = failed_run_of_03(tmp_path, out_env, "checkpont", "rlvr_step_1200")
    assert "unknown notebook parameter" in text and "did you mean 'checkpoint'" in text


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_demo_chain_01_02_03_reads_as_a_user_would(small_book, monkeypatch):
    figures, data = small_book["figures"], small_book["data"]
    text = outputs(figures / "03_teacher_forcing__rlvr_step_1200.ipynb")
    assert "checkpoint 'rlvr_step_1200' (step 1200) vs reference 'dpo'" in text
    tokens = storage.read_table(data / "tokens" / "rlvr_step_1200__vs__dpo")
    monkeypatch.setenv("RLPROBE_PARAMS", small_book["env"]["RLPROBE_PARAMS"])
    P = params.load("demo", "rlvr_step_1200")
    rollouts = forcing_plan.choose(storage.read_table(data / "rollouts"),
                                   storage.read_table(data / "selection"), P)
    assert set(tokens.checkpoint) == {"rlvr_step_1200"} and set(tokens.reference) == {"dpo"}
    assert set(tokens.rollout_id) == set(rollouts.rollout_id)
    assert set(tokens.group) <= {"target", "ref_right", "control", "t1_unselected"}
    t1 = tokens[tokens.group == "t1_unselected"].drop_duplicates("rollout_id")
    assert len(t1) and (t1.temperature == 1.0).all() and t1.problem_id.is_unique
    assert len(tokens) == int(rollouts.n_tokens.sum()), "one row per response token, EOS included"
    for r in rollouts.itertuples():
        rows = tokens[tokens.rollout_id == r.rollout_id].sort_values("pos")
        assert list(rows.token_id) == list(r.response_ids)
        assert (rows.failure_type == r.failure_type).all() and rows.first_token.sum() == 1
    assert ((tokens.dlogp + tokens.k1).abs() < 1e-6).all()
    manifest = storage.read_manifest(data / "tokens" / "rlvr_step_1200__vs__dpo")
    ckpt = next(m for m in manifest["models"] if m["name"] == "rlvr_step_1200")
    assert ckpt["adapter_sha256"] and ckpt["base"]["base"]["gguf_sha256"], "checkpoint over dpo over the GGUF"
    assert (tokens.kl_ref_ckpt > 0).any() and (tokens.kl_ref_ckpt >= 0).all()
    # the progression pair came from the two caches, after the later checkpoint's run
    assert storage.is_complete(data / "tokens" / "rlvr_step_1200__vs__rlvr_step_400")
    # 02 and 03 say what was forced, by failure type and group
    assert "failure_type" in outputs(figures / "02_rollouts.ipynb")
    assert "forced" in text  # the counts of what was forced, by group and failure type


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chapters_04_to_07_write_their_tables_and_pages(small_book):
    figures, data = small_book["figures"], small_book["data"]
    for stem in ("04_divergence", "05_spikes", "06_case_studies", "07_viewer"):
        assert (figures / f"{stem}.html").exists(), small_book["log"][-3000:]
    for table in ("divergence_when", "divergence_categories", "estimator_lab", "spikes"):
        assert storage.is_complete(data / table), table
    when = storage.read_table(data / "divergence_when")
    assert set(when.step) >= {0, 400, 1200}
    from test_book import offline_problems

    page = (figures / "06_case_studies.html").read_text()
    assert "rp-tok" in page and offline_problems(page) == []  # inline SVG's xmlns is no fetch
    assert not (figures / "case_studies.html").exists(), "one case-study page: the chapter's"
    for chart in ("04_when", "05_calibration"):
        assert (figures / f"{chart}.svg").exists() and (figures / f"{chart}.png").exists()


BAD_OUTPUT = re.compile(r"(?i:\b(nan|inf|infinity)\b)|<NA>|\bNaT\b")


def shown_outputs(path) -> str:
    """Everything an executed notebook shows: text, markdown, HTML tables and SVG charts."""
    nb = nbformat.read(path, as_version=4)
    shown = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            shown.append(out.get("text") or "")
            shown += [v if isinstance(v, str) else "".join(v)
                      for k, v in out.get("data", {}).items()
                      if k.startswith("text/") or k == "image/svg+xml"]
    return "\n".join(shown)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("stem", ["04_divergence", "05_spikes",
                                  "06_case_studies",
                                  "08_counterfactuals", "09_takeover"])
def test_an_executed_chapter_shows_no_nan(small_book, stem):
    text = shown_outputs(small_book["figures"] / f"{stem}.ipynb")
    found = [text[max(0, m.start() - 120):m.end() + 40] for m in BAD_OUTPUT.finditer(text)]
    assert found == [], found[:3]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chapter_04_prints_the_t1_check_and_the_phase_order_from_its_tables(small_book):
    text = shown_outputs(small_book["figures"] / "04_divergence.ipynb")
    check = re.search(r"T = 1 check on unselected rollouts[^\n]*", text)
    assert check and "so the check PASSES" in check.group(0), check and check.group(0)
    onsets = storage.read_table(small_book["data"] / "divergence_onsets")
    onsets = onsets[onsets.group == "target"]
    phases = re.search(r"Phases \(Δlogp[^\n]*", text).group(0)
    for r in onsets.itertuples():
        assert f"'{r.category}'" in phases, r.category
        if r.status == "onset":
            assert f"from step {r.onset_step}" in phases
        elif r.status == "too few problems":
            assert f"'{r.category}' ({r.most_problems})" in phases


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chapter_08_branches_prints_its_cost_first_and_writes_a_keyed_table(small_book, monkeypatch):
    from rlprobe_nb.counterfactuals import points

    figures, data = small_book["figures"], small_book["data"]
    assert (figures / "08_counterfactuals.html").exists(), small_book["log"][-3000:]
    text = outputs(figures / "08_counterfactuals.ipynb")
    assert text.index("to sample:") < text.index("sampled and graded:"), "cost before sampling"
    branches = storage.read_table(data / "branches")
    assert {"point", "grid"} <= set(branches.kind) and (branches.n == 2).all()
    assert set(branches.arm) <= {"prefix", "keep", "top1", "correct"}
    assert set(branches.rule.dropna()) <= set(points.SOURCES) | {points.POSITIVE_RULE}
    assert "format" not in set(branches[branches.kind == "point"].ground_truth)
    # the positive control is read before the main result
    assert text.index("positive control (rlvr_step_1200)") < text.index("main result (rlvr_step_1200)")
    assert (figures / "08_takeover.svg").exists() and (figures / "08_takeover.png").exists()
    monkeypatch.setenv("RLPROBE_OUT", small_book["env"]["RLPROBE_OUT"])
    monkeypatch.setenv("RLPROBE_PARAMS", small_book["env"]["RLPROBE_PARAMS"])
    from rlprobe_nb.tables import lineage
    assert len(lineage.read_derived(params.load("demo"), "branches")) == len(branches)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chapter_09_prints_its_cost_first_and_its_ends_match_each_model_alone(small_book,
                                                                             monkeypatch):
    """09 says what it will write before writing; its table holds every rule of every
    checkpoint for every problem; the "never" rule is the same text for every checkpoint
    (the reference alone, same seeds) and no takeover happened in it, "always" took over
    everywhere; the finding is written at the top."""
    figures, data = small_book["figures"], small_book["data"]
    assert (figures / "09_takeover.html").exists(), small_book["log"][-3000:]
    text = outputs(figures / "09_takeover.ipynb")
    assert text.index("to write:") < text.index("written and graded"), "cost before sampling"
    monkeypatch.setenv("RLPROBE_OUT", small_book["env"]["RLPROBE_OUT"])
    monkeypatch.setenv("RLPROBE_PARAMS", small_book["env"]["RLPROBE_PARAMS"])
    T = params.load("demo").takeover
    take = storage.read_table(data / "takeover")
    per = take.groupby(["checkpoint", "problem_id"]).size()
    assert per.nunique() == 1 and per.iloc[0] == 2 + len(T.criteria) * len(T.budgets)  # + ends
    assert "calibrated" in set(take.criterion) and "the placebo run at step" in text
    never = take[take.criterion == "never"]
    assert never.groupby("problem_id").response.nunique().max() == 1
    assert (never.taken.map(len) == 0).all()
    always = take[take.criterion == "always"]
    assert (always.taken.map(len) == always.n_tokens).all()
    assert "finding is written here" not in text.split("to write:")[0]
    from rlprobe_nb.tables import lineage
    assert len(lineage.read_derived(params.load("demo"), "takeover")) == len(take)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_page_of_the_book_opens_offline(small_book):
    from test_book import offline_problems

    pages = sorted(small_book["figures"].glob("*.html"))
    assert len(pages) >= 9
    for page in pages:
        assert offline_problems(page.read_text()) == [], page.name


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_prior_project_import_flows_through_02_and_03(tmp_path, out_env):
    """Problems from the prior project's filtered_problems.json, reference responses from
    its dpo_responses.json: regraded, disagreements listed, forced as text (no specials)."""
    import shutil

    import yaml

    prior = paths.REPO_ROOT / "tests" / "data" / "prior_small"
    root = tmp_path / "params"
    shutil.copytree(paths.params_dir() / "demo", root / "prior")
    suite_file = root / "prior" / "suite.yaml"
    cfg = yaml.safe_load(suite_file.read_text())
    cfg.update(suite="prior")
    cfg["problems"] = {"source": "prior", "path": str(prior / "filtered_problems.json")}
    cfg["filtering"].update(n_samples=1, max_new_tokens=16, ref_max_pass=1.0, target_min_pass=0.0)
    cfg["rollouts"] = {"source": "prior", "prior_path": str(prior / "dpo_responses.json")}
    cfg["forcing"].update(failure_types=["imported"], pairs=[], groups=["target", "ref_right", "control"])
    suite_file.write_text(yaml.safe_dump(cfg))
    env = {**out_env, "RLPROBE_PARAMS": str(root)}
    for nb in ("01_filtering", "02_rollouts"):
        result = papermill(f"{nb}.ipynb", tmp_path / f"{nb}.ipynb", ("suite", "prior"), env=env)
        assert result.returncode == 0, outputs(tmp_path / f"{nb}.ipynb")[-3000:]
    listed = outputs(tmp_path / "02_rollouts.ipynb")
    assert "test/algebra/1.json" in listed and "test/intermediate_algebra/3.json" in listed

    data = Path(env["RLPROBE_OUT"]) / "data" / "prior"
    rollouts = storage.read_table(data / "rollouts")
    assert set(rollouts.token_method) == {"text"} and set(rollouts.finish_reason) == {"imported"}
    verdict = dict(zip(rollouts.problem_id, rollouts.correct))
    assert verdict["test/algebra/1.json"] and not verdict["test/intermediate_algebra/3.json"]

    result = papermill("03_teacher_forcing.ipynb", tmp_path / "03.ipynb",
                       ("suite", "prior"), ("checkpoint", "rlvr_step_1200"), env=env)
    assert result.returncode == 0, outputs(tmp_path / "03.ipynb")[-3000:]
    tokens = storage.read_table(data / "tokens" / "rlvr_step_1200__vs__dpo")
    assert len(tokens) == int(rollouts.n_tokens.sum())
    manifest = storage.read_manifest(data / "tokens" / "rlvr_step_1200__vs__dpo")
    assert manifest["engine"]["token_methods"] == {"text": len(rollouts)}

"""The recorded demo training run, read back: its stages' logs, accuracy, facts and charts.

What ``shipping.ship_run`` wrote under ``data/demo/shipped/run/`` (or a rerun's folder):
the supervised stage (``sft_log.csv``, ``sft_selection.json``), the RLVR and placebo
GRPO runs (``<run>_train_log.csv``), every graded test response (``eval_rows.parquet``),
the accuracy table and the manifest. ``load_recorded_run`` refuses a run whose models
were trained to stop at other tokens than the suite declares.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rlprobe_nb import statistics
from rlprobe_nb.suite import paths, stop_tokens
from rlprobe_nb.tables import storage

SUITE = "demo"
DEMO_RULE = ("correct = math-verify agrees AND the boxed answer is a plain number "
             "(problems.arithmetic.is_plain_number)")
RUN_LABELS = {"dpo": "reference (SFT)", "rlvr": "RLVR", "placebo": "placebo"}


def shipped_root() -> Path:
    return paths.shipped_dir(SUITE)


def shipped_run_dir() -> Path:
    return shipped_root() / "run"


def run_of(model: str) -> str:
    return "dpo" if model == "dpo" else model.rsplit("_step_", 1)[0]


def step_of(model: str) -> int:
    return 0 if model == "dpo" else int(model.rsplit("_", 1)[1])


def accuracy_table(rows: pd.DataFrame, shipped: list[str] | None = None,
                   correct: str = "correct", seed: int = 0) -> pd.DataFrame:
    """Per model: greedy accuracy with a Wilson 95% CI, and the mean accuracy of the
    temperature samples with a 95% CI from a bootstrap over problems (a problem's
    samples are correlated, so whole problems are resampled); ``shipped`` says which
    models ship with the book (the rest were evaluated, not shipped)."""
    out = []
    for model, g in rows.groupby("model", sort=False):
        greedy = g[g["sample"] == 0]
        k, n = int(greedy[correct].sum()), len(greedy)
        lo, hi = statistics.wilson_ci(k, n)
        sampled = g[g["sample"] > 0]
        mean, slo, shi = statistics.cluster_bootstrap_ci(
            sampled[correct].astype(float).to_numpy(), sampled["problem_id"].to_numpy(),
            n_boot=10000, seed=statistics.seed_from(seed, model))
        out.append({
            "model": model, "run": run_of(model), "step": step_of(model), "problems": n,
            "greedy_correct": k, "greedy_acc": k / n, "greedy_low": lo, "greedy_high": hi,
            "samples_per_problem": int(sampled.groupby("problem_id").size().max()),
            "sampled_acc": mean, "sampled_low": slo, "sampled_high": shi,
            "boxed": float((greedy["grade_method"] != "no_box").mean()),
            "shipped": shipped is None or model in shipped,
        })
    order = {"dpo": 0, "rlvr": 1, "placebo": 2}
    table = pd.DataFrame(out)
    return (table.assign(_o=table["run"].map(order)).sort_values(["_o", "step"], kind="stable")
            .drop(columns="_o").reset_index(drop=True))


def load_recorded_run(run_dir: str | Path | None = None, P=None) -> dict:
    """The shipped (or a freshly written) run: logs, selection, accuracy, eval rows and
    manifest. With the suite's parameters ``P``, a run whose models were trained to stop
    at other tokens than the suite's reference declares is refused."""
    run_dir = Path(run_dir) if run_dir is not None else shipped_run_dir()
    if not (run_dir / "manifest.json").is_file():
        raise FileNotFoundError(
            f"{run_dir} holds no recorded demo run (no manifest.json); train one with "
            "scripts/train_demo_suite.py on a GPU and ship it with demo.shipping.ship_run")
    manifest = storage.read_json_object(
        run_dir / "manifest.json", "restore the run's files from the repository (git "
        "checkout) or from the training run that wrote them")
    if P is not None:
        stop_tokens.check_recorded(P.reference, manifest.get("stop_tokens"),
                                   stop_tokens.declared(P.reference, P),
                                   run_dir / "manifest.json")
    logs = {run: pd.read_csv(run_dir / f"{run}_train_log.csv") for run in ("rlvr", "placebo")}
    return {
        "sft_log": pd.read_csv(run_dir / "sft_log.csv"),
        "sft_selection": json.loads((run_dir / "sft_selection.json").read_text()),
        "logs": logs,
        "accuracy": pd.read_csv(run_dir / "accuracy.csv"),
        "rows": pd.read_parquet(run_dir / "eval_rows.parquet"),
        "manifest": manifest,
    }


def sft_evaluations(selection: dict) -> pd.DataFrame:
    """The supervised stage's evaluations on the dev set, the chosen step marked."""
    table = pd.DataFrame([{k: e[k] for k in ("step", "boxed", "accuracy", "stopped")}
                          for e in selection["evals"]])
    return table.assign(chosen=table["step"] == selection["chosen_step"])


def stage_facts(manifest: dict, out: str = "data/demo/training_rerun/raw") -> pd.DataFrame:
    """One row per training stage: what it did, its seed, steps, time and the command
    that reruns it alone on a GPU, writing to ``out`` (complete, to be copied as it is)."""
    run = manifest["training_run"]
    stages = run["stages"]
    sel = run["sft_selection"]
    rows = [{"stage": "sft (the reference, dpo)",
             "what": f"supervised LoRA on {sel['config']['train_problems']} generated solutions; "
                     f"step {sel['chosen_step']} chosen ({sel['why']})",
             "seed": sel["config"]["seed"], "steps": sel["config"]["steps"],
             "seconds": stages["sft"]["wall_seconds"]}]
    for name in ("rlvr", "placebo"):
        cfg = stages["grpo"][name]["config"]
        rows.append({"stage": f"{name} (GRPO, reward {cfg['reward']})",
                     "what": f"{cfg['prompts_per_step']} problems × {cfg['group_size']} samples per "
                             f"step, lr {cfg['learning_rate']}, beta {cfg['beta']}",
                     "seed": cfg["seed"], "steps": cfg["total_steps"],
                     "seconds": stages["grpo"][name]["seconds"]})
    ev = stages["eval"]
    rows.append({"stage": "eval", "what": f"{ev['problems']} test problems, greedy + "
                 f"{ev['samples']} samples at T = {ev['temperature']}",
                 "seed": ev["seed"], "steps": None, "seconds": ev["wall_seconds"]})
    table = pd.DataFrame(rows)
    table["rerun (GPU)"] = [f"python scripts/train_demo_suite.py --out {out} {s}"
                            for s in ("sft", "rlvr", "placebo", "eval")]
    return table


def run_facts(manifest: dict) -> pd.DataFrame:
    """Command, device, stop tokens, adapter encoding and package versions of the run."""
    run = manifest["training_run"]
    facts = {"command": run["command"], "device": run.get("device_name"),
             "stop tokens": manifest.get("stop_tokens"), "why these": manifest.get("stop_note"),
             "adapters shipped as": manifest.get("adapter_encoding"),
             "python (training)": run.get("python"),
             **{f"{k} (training)": v for k, v in run["packages"].items() if v}}
    return pd.DataFrame({"fact": list(facts), "value": [str(v) for v in facts.values()]})


def original_checksums(manifest: dict) -> pd.DataFrame:
    """sha256 of each original (bf16) adapter file the shipped ones were encoded from."""
    sums = manifest["original_adapter_sha256"]
    return pd.DataFrame({"model": list(sums), "sha256 (original bf16)": list(sums.values())})


def accuracy_display(table: pd.DataFrame, temperature: float) -> pd.DataFrame:
    """The accuracy table as a reader reads it: each estimate with its interval as text
    (``temperature``: the evaluation's sampling temperature, for the column's name)."""
    from rlprobe_nb import reporting

    shown = table[table["shipped"]].drop(columns="shipped")
    return reporting.display_table(
        shown[["model", "run", "step", "problems", "greedy_acc", "greedy_low", "greedy_high",
               "sampled_acc", "sampled_low", "sampled_high", "boxed"]],
        intervals={"greedy (Wilson 95%)": ("greedy_acc", "greedy_low", "greedy_high", "problems"),
                   f"sampled, T = {temperature:g} (95%, problems resampled)":
                       ("sampled_acc", "sampled_low", "sampled_high", "problems")})


def accuracy_sentences(table: pd.DataFrame) -> list[str]:
    """What the accuracy table says, in words, every number read from it."""
    from rlprobe_nb import reporting

    def line(model: str) -> str:
        row = table.set_index("model").loc[model]
        return (f"{model}: {reporting.interval_text(row.greedy_acc, row.greedy_low, row.greedy_high, int(row.problems))}"
                f" greedy, {reporting.interval_text(row.sampled_acc, row.sampled_low, row.sampled_high, int(row.problems))} sampled")

    shipped = table[table["shipped"]]
    last = {run: shipped[shipped["run"] == run].sort_values("step")["model"].iloc[-1]
            for run in ("rlvr", "placebo")}
    ref = table.set_index("model").loc["dpo"]
    rlvr = shipped[shipped["run"] == "rlvr"].sort_values("step")
    above = rlvr[rlvr["greedy_low"] > ref["greedy_high"]]
    first = (f"the first RLVR checkpoint whose greedy interval lies above the reference's is "
             f"{above['model'].iloc[0]}" if len(above) else
             "no RLVR checkpoint's greedy interval lies above the reference's")
    placebo_above = shipped[(shipped["run"] == "placebo") & (shipped["greedy_low"] > ref["greedy_high"])]
    return [line("dpo"), line(last["rlvr"]), line(last["placebo"]), first + ";",
            f"placebo checkpoints whose greedy interval lies above the reference's: "
            f"{len(placebo_above)} of {int((shipped['run'] == 'placebo').sum())}."]

"""The recorded demo RLVR run: ship it into the book, read it back, tabulate, plot.

``ship_run`` turns a run folder written by ``scripts/train_demo_suite.py`` into the small
files committed under ``data/demo/shipped/``:

  adapters/rlvr_step_N/   adapter_config.json, adapter_model.safetensors (bf16)
  run/train_log.csv       one row per optimizer step (reward, accuracy, KL-to-start...)
  run/eval_rows.parquet   every graded response of every model on the test problems
  run/accuracy.csv        accuracy by checkpoint with 95% confidence intervals
  run/manifest.json       command, configuration, seeds, device, package versions, grader
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from rlprobe_nb import statistics
from rlprobe_nb.suite import paths
from rlprobe_nb.tables import storage

SUITE = "demo"


def shipped_run_dir() -> Path:
    return paths.shipped_dir(SUITE) / "run"


def shipped_adapters_dir() -> Path:
    return paths.shipped_dir(SUITE) / "adapters"


def _step(name: str) -> int:
    return 0 if name == "dpo" else int(name.rsplit("_", 1)[1])


def accuracy_table(rows: pd.DataFrame, correct: str = "correct", seed: int = 0) -> pd.DataFrame:
    """Per model: greedy accuracy with a Wilson 95% CI, and the mean accuracy of the
    temperature samples with a 95% CI from a bootstrap over problems (a problem's
    samples are correlated, so whole problems are resampled)."""
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
            "model": model, "step": _step(model), "problems": n,
            "greedy_correct": k, "greedy_acc": k / n, "greedy_low": lo, "greedy_high": hi,
            "samples_per_problem": int(sampled.groupby("problem_id").size().max()),
            "sampled_acc": mean, "sampled_low": slo, "sampled_high": shi,
            "greedy_acc_mathverify_only": float(greedy["grader_correct"].mean())
            if "grader_correct" in greedy else float("nan"),
        })
    return pd.DataFrame(out).sort_values("step", kind="stable").reset_index(drop=True)


def ship_run(run_dir: str | Path, extra: dict | None = None,
             dest_root: str | Path | None = None) -> Path:
    """Copy a finished run (adapters, log, graded evaluation) into data/demo/shipped/
    (or into ``dest_root``, e.g. for a reproduction that must not overwrite the record).
    Returns the folder that ``load_recorded_run`` reads."""
    from rlprobe_nb.problems import grading
    from rlprobe_nb.tables import provenance

    run_dir = Path(run_dir)
    root = Path(dest_root) if dest_root is not None else paths.shipped_dir(SUITE)
    record = json.loads((run_dir / "run.json").read_text())
    for required in ("train_log.csv", "eval_rows.jsonl", "adapters"):
        if not (run_dir / required).exists():
            raise FileNotFoundError(f"{run_dir} has no {required}: the run is unfinished")
    dest_adapters = root / "adapters"
    dest_adapters.mkdir(parents=True, exist_ok=True)
    for src in sorted((run_dir / "adapters").glob("rlvr_step_*")):
        tmp = dest_adapters / f".{src.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy2(src / f, tmp / f)
        shutil.rmtree(dest_adapters / src.name, ignore_errors=True)
        tmp.rename(dest_adapters / src.name)
    dest = root / "run"
    dest.mkdir(parents=True, exist_ok=True)
    log = pd.read_csv(run_dir / "train_log.csv")
    storage.atomic_write_text(dest / "train_log.csv", log.to_csv(index=False))
    rows = pd.read_json(run_dir / "eval_rows.jsonl", lines=True)
    with storage.atomic_path(dest / "eval_rows.parquet") as tmp:
        rows.to_parquet(tmp, index=False)
    table = accuracy_table(rows)
    storage.atomic_write_text(dest / "accuracy.csv", table.to_csv(index=False))
    cfg = record["config"]
    manifest = provenance.manifest(
        seeds={"train": cfg["seed"], "train_problems": cfg["seed"],
               "eval_problems": record["eval"]["problem_seed"],
               "eval_sampling": record["eval"]["seed"]},
        grader={**grading.grader_info(),
                "demo_rule": "correct = math-verify agrees AND the boxed answer is a plain "
                             "number (demo_problems.is_plain_number)"},
        extra={"training_run": record, "steps": int(log["step"].max()),
               "adapters": sorted(p.name for p in dest_adapters.glob("rlvr_step_*")),
               **(extra or {})})
    storage.atomic_write_json(dest / "manifest.json", manifest)
    return dest


def load_recorded_run(run_dir: str | Path | None = None) -> dict:
    """The shipped (or a freshly written) run: log, accuracy table, eval rows, manifest."""
    run_dir = Path(run_dir) if run_dir is not None else shipped_run_dir()
    if not (run_dir / "manifest.json").is_file():
        raise FileNotFoundError(
            f"{run_dir} holds no recorded demo run (no manifest.json); train one with "
            "scripts/train_demo_suite.py on a GPU and ship it with demo_viz.ship_run")
    return {
        "log": pd.read_csv(run_dir / "train_log.csv"),
        "accuracy": pd.read_csv(run_dir / "accuracy.csv"),
        "rows": pd.read_parquet(run_dir / "eval_rows.parquet"),
        "manifest": storage.read_json(run_dir / "manifest.json"),
    }


def smoothed_log(log: pd.DataFrame, window: int = 25) -> pd.DataFrame:
    """Long-form moving averages of the per-step signals, for plotting."""
    cols = {"reward_mean": "reward", "accuracy": "train accuracy",
            "format_rate": "well-formed rate", "kl_to_start": "KL to start (k3, nats/token)"}
    smooth = log.set_index("step")[list(cols)].rolling(window, min_periods=1).mean()
    return (smooth.rename(columns=cols).reset_index()
            .melt(id_vars="step", var_name="signal", value_name="value"))


def training_curves(log: pd.DataFrame, window: int = 25):
    """Reward, accuracy and format rate (left) and KL to the start model (right)."""
    import altair as alt

    data = smoothed_log(log, window)
    base = alt.Chart(data).mark_line().encode(
        x=alt.X("step:Q", title="optimizer step"),
        y=alt.Y("value:Q", title=None),
        color=alt.Color("signal:N", legend=alt.Legend(orient="bottom", title=None)),
        tooltip=["step", "signal", alt.Tooltip("value:Q", format=".3f")])
    rewards = base.transform_filter(alt.datum.signal != "KL to start (k3, nats/token)").properties(
        width=320, height=200, title=f"reward and accuracy ({window}-step mean)")
    kl = base.transform_filter(alt.datum.signal == "KL to start (k3, nats/token)").properties(
        width=320, height=200, title="KL(policy ‖ start), k3 estimate")
    return alt.hconcat(rewards, kl)


def accuracy_chart(table: pd.DataFrame):
    """Accuracy by checkpoint, greedy and sampled, with 95% CIs as error bars."""
    import altair as alt

    long = pd.concat([
        table.assign(measure="greedy", acc=table.greedy_acc, low=table.greedy_low,
                     high=table.greedy_high),
        table.assign(measure="sampled (T=0.7)", acc=table.sampled_acc, low=table.sampled_low,
                     high=table.sampled_high),
    ])[["model", "step", "measure", "acc", "low", "high"]]
    x = alt.X("model:N", sort=list(table.model), title=None)
    points = alt.Chart(long).mark_point(filled=True).encode(
        x=x, y=alt.Y("acc:Q", title="test accuracy", scale=alt.Scale(domain=[0, 1])),
        color="measure:N", xOffset="measure:N",
        tooltip=["model", "measure", alt.Tooltip("acc:Q", format=".3f"),
                 alt.Tooltip("low:Q", format=".3f"), alt.Tooltip("high:Q", format=".3f")])
    bars = alt.Chart(long).mark_rule().encode(x=x, y="low:Q", y2="high:Q", color="measure:N",
                                              xOffset="measure:N")
    return (bars + points).properties(width=420, height=220,
                                      title="held-out accuracy with 95% CIs")


def run_facts(manifest: dict) -> pd.DataFrame:
    """Command, seeds, device, timings and package versions of the recorded run."""
    run = manifest["training_run"]
    facts = {"command": run["command"], "device": run.get("device_name"),
             "train seconds": run.get("train_seconds"), "eval seconds": run.get("eval_seconds"),
             **{f"seed: {k}": v for k, v in manifest["seeds"].items()},
             **{f"eval {k}": v for k, v in run["eval"].items()},
             "python (training)": run.get("python"),
             **{f"{k} (training)": v for k, v in run["packages"].items() if v}}
    return pd.DataFrame({"fact": list(facts), "value": [str(v) for v in facts.values()]})

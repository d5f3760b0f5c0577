"""Ship a finished demo training run into the book: the three stages, small and checked.

``ship_run`` turns a run folder written by ``scripts/train_demo_suite.py ... all`` into the
files committed under ``data/demo/shipped/``:

  adapters/dpo/                 the supervised reference (SFT), over the GGUF base
  adapters/rlvr_step_N/         GRPO with the verifiable reward, over the reference
  adapters/placebo_step_N/      the same GRPO with rewards permuted within each round
      each: adapter_config.json, adapter_int8.safetensors (``suite.compact_adapters``:
      8 bits, half of bf16) and rlprobe_training.json (config, step, stop tokens)
  run/sft_log.csv, run/sft_selection.json           the supervised stage and its choice
  run/rlvr_train_log.csv, run/placebo_train_log.csv one row per optimizer step
  run/eval_rows.parquet         every graded test response of every evaluated model
  run/accuracy.csv              accuracy by model with 95% intervals
  run/fidelity.parquet          forced log-probs of a few rollouts under the original
                                adapters, which the shipped ones are tested against
  run/manifest.json             the run's record, stop tokens, original checksums, seeds

The stop tokens the run's models were trained to end with are part of their identity:
taken from the run's ``run.json`` (``stop_tokens``), or, for a run recorded before it
held them, given to ``ship_run`` with a note saying how they were established.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from rlprobe_nb.demo import training_run
from rlprobe_nb.suite import compact_adapters
from rlprobe_nb.suite.stop_tokens import TRAINING_RECORD
from rlprobe_nb.tables import storage
from rlprobe_nb.tables.atomic import atomic_folder

RUNS = ("rlvr", "placebo")
FIDELITY_ROLLOUTS = 6


def run_adapters(run_dir: Path, steps: tuple[int, ...] | None = None) -> dict[str, Path]:
    """Name -> original adapter folder: the reference, then each run's checkpoints."""
    found = {"dpo": run_dir / "sft" / "adapters" / "dpo"}
    for run in RUNS:
        for folder in sorted((run_dir / run / "adapters").glob(f"{run}_step_*"),
                             key=lambda p: int(p.name.rsplit("_", 1)[1])):
            if steps is None or int(folder.name.rsplit("_", 1)[1]) in steps:
                found[folder.name] = folder
    missing = [str(p) for p in found.values()
               if not (p / compact_adapters.PEFT_FILE).is_file()]
    if missing:
        raise FileNotFoundError(f"the run is unfinished: no adapter weights in {missing}")
    return found


def _stop_record(record: dict, given: list[str] | None, note: str | None) -> dict:
    recorded = record.get("stop_tokens")
    if recorded is None and given is None:
        raise ValueError(
            "run.json records no stop_tokens (a run from before they were recorded): pass "
            "stop_tokens=[...] with stop_note saying how they were established")
    if recorded is not None and given is not None and sorted(recorded) != sorted(given):
        raise ValueError(f"run.json records stop tokens {recorded}, not {given}")
    return {"stop_tokens": list(recorded if recorded is not None else given),
            "stop_note": note or record.get("stop_source", "")}


def _eval_rows(run_dir: Path) -> pd.DataFrame:
    for name in ("eval_rows.jsonl", "eval_rows.jsonl.gz"):
        if (run_dir / name).is_file():
            return pd.read_json(run_dir / name, lines=True)
    raise FileNotFoundError(f"{run_dir} has no eval_rows.jsonl(.gz): the run is unfinished")


def _encode_adapters(adapters: dict[str, Path], dest: Path, stop: dict) -> dict[str, str]:
    """Every adapter in 8 bits into ``dest`` (replaced whole); name -> original sha256."""
    with atomic_folder(dest) as tmp:
        for name, src in adapters.items():
            training = json.loads((src / TRAINING_RECORD).read_text())
            training.setdefault("stop_tokens", stop["stop_tokens"])
            compact_adapters.encode_folder(src, tmp / name, texts={
                TRAINING_RECORD: json.dumps(training, indent=2, sort_keys=True) + "\n"})
    return {name: compact_adapters.metadata(dest / name)["source_sha256"] for name in adapters}


def ship_run(run_dir: str | Path, dest_root: str | Path | None = None, *,
             stop_tokens: list[str] | None = None, stop_note: str | None = None,
             steps: tuple[int, ...] | None = None) -> Path:
    """Copy a finished run into ``dest_root`` (default ``data/demo/shipped``); returns the
    ``run/`` folder that ``training_run.load_recorded_run`` reads. ``steps`` keeps only
    those checkpoints of each run (default: every saved one)."""
    from rlprobe_nb.demo import fidelity
    from rlprobe_nb.problems import grading
    from rlprobe_nb.tables import provenance

    run_dir = Path(run_dir)
    root = Path(dest_root) if dest_root is not None else training_run.shipped_root()
    record = json.loads((run_dir / "run.json").read_text())
    stop = _stop_record(record, stop_tokens, stop_note)
    adapters = run_adapters(run_dir, steps)
    rows = _eval_rows(run_dir)
    originals = _encode_adapters(adapters, root / "adapters", stop)
    check = fidelity.measure(adapters, root / "adapters", rows, FIDELITY_ROLLOUTS,
                             stop["stop_tokens"][0])
    dest = root / "run"
    with atomic_folder(dest) as tmp:  # the whole record at once: no file of an older run stays
        shutil.copyfile(run_dir / "sft" / "log.csv", tmp / "sft_log.csv")
        shutil.copyfile(run_dir / "sft" / "selection.json", tmp / "sft_selection.json")
        for run in RUNS:
            shutil.copyfile(run_dir / run / "train_log.csv", tmp / f"{run}_train_log.csv")
        rows.to_parquet(tmp / "eval_rows.parquet", index=False)
        table = training_run.accuracy_table(rows, shipped=list(adapters))
        (tmp / "accuracy.csv").write_text(table.to_csv(index=False))
        check.table.to_parquet(tmp / "fidelity.parquet", index=False)
        storage.atomic_write_json(tmp / "manifest.json", provenance.manifest(
            seeds={"train": record["stages"]["grpo"]["rlvr"]["config"]["seed"],
                   "eval_problems": record["stages"]["eval"]["problem_seed"],
                   "eval_sampling": record["stages"]["eval"]["seed"]},
            grader={**grading.grader_info(), "demo_rule": training_run.DEMO_RULE},
            extra={"training_run": record, **stop, "adapters": list(adapters),
                   "adapter_encoding": compact_adapters.ENCODING,
                   "original_adapter_sha256": originals, "fidelity": check.summary}))
    return dest

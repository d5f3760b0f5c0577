"""Bring your own run: a trainer's run folder -> a suite of the book.

    python -m rlprobe_nb.suite.discover RUN_DIR --name NAME --reference REF
        [--framework auto|verl|trl|openrlhf|open-instruct|nemo-rl|hub|folders]
        [--placebo RUN2] [--steps 100,200] [--like demo|tulu3] [--convert-to DIR]
        [--dtype keep|bfloat16|float32] [--lora-alpha A] [--tokenizer-from checkpoint|reference]
        [--dry-run] [--force]

It detects the layout by content (``run_layouts``, ``trainer_layouts``), lists every
checkpoint with its step and where the step came from, skips incomplete saves saying why,
checks each checkpoint's architecture and tokenizer against REF before any weights are read
(``run_checks``), prints the plan (use as is / convert / refuse with the command to run
instead), converts what must be converted into the cache (``run_convert``: atomic,
resumable, never inside the run folder) and writes ``params/NAME/`` with a record of what it
found (``suite_writer``), validated by ``params.load``. REF is required: no trainer but
NeMo-RL records its reference. With ``--framework hub``, RUN_DIR is a hub id whose
``step_N`` branches are the checkpoints (how params/tulu3 is laid out).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Optional

from rlprobe_nb.suite import paths, run_checks, run_convert, suite_writer
from rlprobe_nb.suite.convert_fsdp import has_lora, lora_alpha
from rlprobe_nb.suite.run_layouts import (DiscoverError, Found, Skipped, choose_framework,
                                          enumerate_run)

FRAMEWORK_CHOICES = ("auto", "verl", "trl", "openrlhf", "open-instruct", "nemo-rl", "hub",
                     "folders")
STEP_MEANING = {"trl": "one optimizer step", "verl": "one rollout batch (PPO iteration)",
                "openrlhf": "one rollout batch", "open-instruct": "one rollout batch",
                "nemo-rl": "one rollout batch", "hub": "as the publisher named the branches",
                "folders": "the number in each folder's name"}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m rlprobe_nb.suite.discover",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="the run's output folder (with --framework hub: a hub id)")
    ap.add_argument("--name", required=True, help="the suite to write: params/NAME/")
    ap.add_argument("--reference", required=True,
                    help="the model the run started from: a folder, a .gguf or org/name[@rev]")
    ap.add_argument("--reference-name", default="initial")
    ap.add_argument("--framework", default="auto", choices=FRAMEWORK_CHOICES)
    ap.add_argument("--placebo", help="a placebo run's folder, laid out as RUN_DIR")
    ap.add_argument("--steps", help="only these steps, e.g. 100,200,400")
    ap.add_argument("--main-step", type=int,
                    help="--framework hub: the step of the main branch (the final model)")
    ap.add_argument("--like", default="tulu3", help="copy the other sections from this suite")
    ap.add_argument("--convert-to", help="where conversions go (default: the cache's runs/NAME)")
    ap.add_argument("--dtype", default="keep", choices=("keep", "bfloat16", "float32"))
    ap.add_argument("--lora-alpha", type=float, help="verl LoRA shards without lora_train_meta.json")
    ap.add_argument("--tokenizer-from", default="checkpoint", choices=("checkpoint", "reference"))
    ap.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    ap.add_argument("--force", action="store_true", help="replace an existing params/NAME/")
    return ap.parse_args(argv)


def hub_found(repo: str, main_step: Optional[int] = None) -> tuple[list[Found], list[Skipped]]:
    """The ``step_N`` branches of a hub model, and ``main`` at ``main_step`` when given
    (offline: refused with the hint)."""
    from rlprobe_nb.suite import models

    try:
        branches = models.list_revisions(repo)
    except Exception as exc:
        raise DiscoverError(f"{repo}: cannot list its branches on the hub ({type(exc).__name__}: "
                            f"{exc}). Run online, or check by hand: python -c \"from "
                            f"rlprobe_nb.suite import models; print(models.list_revisions("
                            f"'{repo}'))\"") from exc
    found = []
    for b in branches:
        m = re.fullmatch(r"step_(\d+)", b)
        if m:
            found.append(Found(int(m.group(1)), f"hub branch {b}", Path(repo), "hub",
                               extra={"id": repo, "revision": b}))
    if main_step is not None and "main" in branches:
        found.append(Found(main_step, "main branch at --main-step", Path(repo), "hub",
                           extra={"id": repo, "revision": "main"}))
    others = [b for b in branches if not re.fullmatch(r"step_(\d+)", b)
              and not (b == "main" and main_step is not None)]
    skipped = [Skipped(Path(f"{repo}@{b}"), "not a step_N branch (its step is unknown; for "
                       "main, give it with --main-step)")
               for b in others]
    return sorted(found, key=lambda f: f.step), skipped


def find(run_dir: str, framework: str, main_step: Optional[int] = None):
    """(framework, checkpoints found, incomplete saves skipped)."""
    if framework == "hub":
        return "hub", *hub_found(run_dir, main_step)
    run = Path(run_dir).expanduser().resolve()
    fw = choose_framework(run, framework)
    return fw, *enumerate_run(run, fw)


def select(found: list[Found], steps: Optional[str], run_dir: str) -> list[Found]:
    if not steps:
        return found
    try:
        wanted = [int(s) for s in steps.split(",") if s.strip()]
    except ValueError:
        raise DiscoverError(f"--steps {steps!r}: expected step numbers separated by commas")
    have = {f.step: f for f in found}
    missing = [s for s in wanted if s not in have]
    if missing:
        raise DiscoverError(f"{run_dir}: no checkpoint at steps {missing}; found steps "
                            f"{sorted(have)}")
    return [have[s] for s in wanted]


def check(found: list[Found], ref_dir: Optional[Path], args) -> None:
    """Architecture, tokenizer and LoRA scale of every checkpoint, before any weights load."""
    tokenizers = run_checks.TokenizerCheck(ref_dir)
    for f in found:
        if f.weights == "hub":
            f.notes.append("a hub revision: its architecture and tokenizer are checked when "
                           "the book loads it")
        if f.refuse or f.weights == "hub":
            continue
        if args.tokenizer_from == "reference":
            f.tokenizer_dir = None  # the converted or linked folder gets the reference's
        hint = f.extra.get("reference_hint") or _adapter_base(f)
        if hint and str(hint) != args.reference:
            f.notes.append(f"the run names {hint} as its model; --reference is {args.reference} "
                           "(kept: check that they are the same model)")
        run_checks.check_architecture(f, ref_dir)
        if not f.refuse:
            tokenizers.check(f)
        if not f.refuse and f.weights == "fsdp_shards" and has_lora(f.extra["shards"]):
            try:
                r, alpha = lora_alpha(f.folder, f.extra.get("lora_meta"), args.lora_alpha)
            except DiscoverError as exc:
                f.refuse = str(exc)
                continue
            f.extra.update(lora=True, lora_r=r, lora_alpha=alpha)
            f.notes.append("LoRA: only the adapter is kept; the shards' base weights are taken "
                           "to be the reference's (not compared)")


def _adapter_base(f: Found) -> Optional[str]:
    config = f.folder / "adapter_config.json"
    if f.weights in ("peft", "peft_bin") and config.is_file():
        return json.loads(config.read_text()).get("base_model_name_or_path")
    return None


def print_plan(rows: list[tuple[str, Found]], skipped: list[Skipped], out=None) -> None:
    out = out or sys.stdout
    print(f"{'checkpoint':<22} {'step':>7}  {'weights':<12} action / step from", file=out)
    for name, f in rows:
        print(f"{name:<22} {f.step:>7}  {f.weights:<12} {run_convert.action(f, {})}", file=out)
        print(f"{'':<22} {'':>7}  {'':<12} step: {f.step_source}; {f.folder}", file=out)
        for note in f.notes:
            print(f"{'':<43} note: {note}", file=out)
        if f.refuse:
            print(f"{'':<43} REFUSED: {f.refuse}", file=out)
    for s in skipped:
        print(f"skipped {s.folder}: {s.why}", file=out)


def dumps_and_logs(run_dir: str, framework: str, rows) -> dict[str, list[str]]:
    """What else the run folder holds for the book: TRL's completion dumps (import them with
    python -m rlprobe_nb.import_rollouts) and the trainer's logs."""
    found: dict[str, list[str]] = {}
    if framework == "trl":
        dumps = sorted(Path(run_dir).glob("completions/completions_*.parquet"))
        if dumps:
            found["completions (python -m rlprobe_nb.import_rollouts)"] = \
                [str(p) for p in dumps]
        states = [str(f.extra["trainer_state"]) for _, f in rows if "trainer_state" in f.extra]
        if states:
            found["trainer logs (divergence.trainer_kl.trl_log)"] = states[-1:]
    return found


def spec_of(f: Found, out: Optional[Path], ref_name: str) -> dict:
    if f.weights == "hub":
        return {"kind": "hub", "id": f.extra["id"], "revision": f.extra["revision"]}
    if f.weights == "peft":
        return {"kind": "peft", "base": ref_name, "path": str(f.folder)}
    if out is None:
        return {"kind": "local", "path": str(f.folder)}
    if f.weights == "peft_bin" or f.extra.get("lora"):
        return {"kind": "peft", "base": ref_name, "path": str(out)}
    return {"kind": "local", "path": str(out)}


def discover(args) -> dict:
    framework, found, skipped = find(args.run_dir, args.framework, args.main_step)
    runs = {"rlvr": select(found, args.steps, args.run_dir)}
    if args.placebo:
        _, placebo, p_skipped = find(args.placebo, framework if framework != "hub" else "hub")
        rlvr_steps = {f.step for f in runs["rlvr"]}
        runs["placebo"] = [f for f in placebo if f.step in rlvr_steps]
        skipped += p_skipped + [Skipped(f.folder, f"placebo step {f.step} has no RLVR checkpoint "
                                                  "(params refuses a placebo without one); left out")
                                for f in placebo if f.step not in rlvr_steps]
    if not runs["rlvr"]:
        raise DiscoverError(f"{args.run_dir}: no usable checkpoint ({framework} layout); "
                            + "; ".join(f"{s.folder}: {s.why}" for s in skipped))
    ref_spec = run_checks.reference_spec(args.reference)
    ref_dir = run_checks.reference_folder(ref_spec)
    rows = [(f"{run}_step_{f.step}", f) for run, fs in runs.items() for f in fs]
    check([f for _, f in rows], ref_dir, args)
    print(f"{args.run_dir}: {framework} layout; a step is {STEP_MEANING[framework]}")
    print_plan(rows, skipped)
    refused = [(n, f) for n, f in rows if f.refuse]
    if refused:
        raise DiscoverError("refused: " + " | ".join(f"{n}: {f.refuse}" for n, f in refused))
    record = {"framework": framework, "run_dir": args.run_dir, "placebo_dir": args.placebo,
              "reference": args.reference, "step_meaning": STEP_MEANING[framework],
              "checkpoints": {}, "skipped": [{"folder": str(s.folder), "why": s.why}
                                             for s in skipped],
              "rollout_dumps": dumps_and_logs(args.run_dir, framework, rows)}
    for kind, files in record["rollout_dumps"].items():
        print(f"{kind}: {len(files)} file(s), e.g. {files[0]}")
    if args.dry_run:
        return {"plan": rows, "record": record}
    return _convert_and_write(args, rows, ref_spec, ref_dir, record, framework)


def _convert_and_write(args, rows, ref_spec, ref_dir, record, framework) -> dict:
    root = Path(args.convert_to) if args.convert_to else paths.cache_dir() / "runs" / args.name
    options = {"dtype": args.dtype, "reference_keys": run_checks.reference_keys(ref_dir)}
    entries = []
    for name, f in rows:
        needs = run_convert.action(f, options).startswith("convert")
        out, conversion = None, None
        if needs:
            out = root / name
            print(f"{name}: converting into {out} ...", flush=True)
            conversion = run_convert.convert(f, out, ref_dir, options)
            if conversion.get("reused"):
                print(f"{name}: already converted (sources and outputs match {out}/converted.json)")
        spec = spec_of(f, out, args.reference_name)
        run = name.split("_step_")[0]
        entries.append({"name": name, "step": f.step, "run": run, "model": spec,
                        "comment": f"{framework} {f.step_source}: {f.folder}"})
        record["checkpoints"][name] = {**f.as_record(), "model": spec, "conversion": conversion}
    description = (f"{framework} run {Path(args.run_dir).name}: steps "
                   f"{', '.join(str(e['step']) for e in entries if e['run'] == 'rlvr')}")
    folder = suite_writer.write(args.name, entries, (args.reference_name, ref_spec), args.like,
                                description, record, args.force)
    print(f"wrote {folder} ({len(entries)} checkpoints); it loads with params.load({args.name!r})")
    return {"plan": rows, "record": record, "folder": folder}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        discover(args)
    except DiscoverError as exc:
        print(f"discover: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

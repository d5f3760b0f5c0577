"""What ``params/tulu3`` costs on GPUs: Llama-3.1-8B-shaped models through the book's GPU
stages, on 1 and on N GPUs, timed per stage, then extrapolated to the suite's full sizes.

Random weights (cost, not findings), bf16, saved once with ``save_pretrained`` to local
disk and loaded as the book loads a hub model (``from_pretrained(dtype=bfloat16)`` then
``.to("cuda")``), each load after the model's files were dropped from the page cache
(``posix_fadvise(DONTNEED)``), so the load time is a read from disk.

Stages, each through the book's own code and multi-GPU path (``distributed``):

  gen    01/02: ``decoding.generate`` (the loop ``rollouts.generate_rollouts`` calls) with
         01's shards (model x chunk of problems, ``SHARD_BATCHES`` batches of 64 slots),
         greedy + 8 samples per problem, 1,024 new tokens, the compiled step
         (``runtime.compile_decode: true``), shards shared by ``distributed.run_sharded``
         as ``sample_to_table`` shares them; two models (01 samples the reference and
         the target).
  force  03: the reference forwarded into its hidden-state cache (``forcing.sharded
         .run_pair``, batches shared), then checkpoints one per worker
         (``plan.force_checkpoints``'s way), each ``forcing.run_checkpoint`` against the
         cached reference, token tables on disk, the book's engine defaults.
  cont   08: continuations (``decoding.generate`` as ``continue_contexts`` calls it: 16
         per context, 512 new tokens, 64 rows at a time, uncompiled step), shards (model
         x 4 contexts) shared as ``run_branches`` shares them; two policy models.

Random weights never write an end-of-turn token on purpose, so every sequence runs to its
limit: the figures are for responses at the cap (an upper bound; scale the decode terms
by mean length / cap). Grading (CPU, math-verify) and pages are not timed.

Extrapolation to ``params/tulu3`` (``FULL``; the counts that only 01 can tell are stated
assumptions), per stage on W GPUs:

    T(W) = S(W) + L(W) * t_load + t_setup_first + (L(W) - 1) * t_setup_next + U / (W * r_W)

S(W): worker start and the coordinator's own work (measured: the stage's wall minus its
steps' slowest workers); L(W): model loads a worker makes in turn (01, 08: ceil(models /
W); 02: 1); t_load: a load from disk; t_setup_first / t_setup_next: the decode engine's
set-up after a process's first / a later load (compilation of the step, graph capture;
the first on a fresh machine compiles cold, an upper bound for later processes, whose
compiler cache is warm); U: the stage's work (tokens generated); r_W: one worker's rate
on W GPUs. 03: the reference's batches shared by the W workers (one load each), then the
checkpoints one per worker in ceil(checkpoints / W) rounds, each a load and a whole
forward (rows / r), the layers' compilation inside r. Parameters are those measured on W
GPUs where that run exists, else on the largest number measured (an extrapolation; the
report names which).

    python benchmarks/bench_8b_cost.py prepare --models /root/m8b --only ref
    python benchmarks/bench_8b_cost.py stage gen --workers 1 --models /root/m8b --out R
    python benchmarks/bench_8b_cost.py report --results R --json R/cost_report.json
    python benchmarks/bench_8b_cost.py all --tiny      # CPU dry run of everything (gloo)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlprobe_nb import distributed  # noqa: E402  (before torch: NVML, no CUDA in the coordinator)

EOS = [128001, 128008, 128009]  # Llama 3.1's end tokens (a random model rarely draws them)

# params/tulu3 at full size. MATH test levels 3 and 4: 1,131 + 1,214 problems.
FULL = {
    "problems_01": 2345, "answers_per_problem_01": 9,  # greedy + filtering.n_samples 8
    "models_01": 2,  # the reference (dpo) and the target (rlvr_step_2440)
    "max_new_tokens": 1024,
    # assumption: selected + control problems after 01 (its selection decides; 02 and 03
    # scale linearly with it)
    "problems_02": 200, "rollouts_per_problem_02": 5,
    # 03: every rollout forced (an upper bound: the failure-type policy keeps fewer), the
    # reference once, then 12 RLVR checkpoints and sft (the dpo-sft pair) one per worker
    "checkpoints_03": 13,
    # 08: suite.yaml's count, 48*2 + 48*2 + 48 + 4*12 contexts, 16 continuations each,
    # 512 new tokens, over two policy models (the checkpoint and the reference)
    "contexts_08": 288, "n_08": 16, "continuation_tokens_08": 512, "models_08": 2,
}


def _cfg(tiny: bool):
    from random_models import llama_8b_config, tiny_config
    if tiny:
        return tiny_config(eos_token_id=EOS[-1] % 1000, bos_token_id=1)
    return llama_8b_config(eos_token_id=EOS, bos_token_id=128000)


def _sizes(args) -> dict:
    if args.tiny:
        return dict(prompt_len=16, max_new=24, problems=6, samples=3, slots=8,
                    rollouts=24, response_len=40, checkpoints=2, batch_tokens=512,
                    contexts=4, n=4, prefix_len=8, cont_tokens=12, per_shard=2)
    return dict(prompt_len=args.prompt_len, max_new=1024, problems=args.problems, samples=9,
                slots=64, rollouts=args.rollouts, response_len=args.response_len,
                checkpoints=args.checkpoints, batch_tokens=8192, contexts=args.contexts,
                n=16, prefix_len=args.prefix_len, cont_tokens=512, per_shard=4)


def _device(tiny: bool) -> str:
    return "cpu" if tiny else "cuda"


def _card(tiny: bool) -> str:
    if tiny:
        return "cpu"
    import pynvml  # the coordinator stays free of CUDA
    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))


# models -----------------------------------------------------------------------------
def prepare(args) -> None:
    import torch
    from random_models import build_model
    for name, seed in (("ref", 1), ("ckpt", 0)):
        if args.only and name != args.only:
            continue
        t = time.perf_counter()
        dtype = torch.float32 if args.tiny else torch.bfloat16
        model = build_model(_cfg(args.tiny), seed, _device(args.tiny), dtype)
        built = time.perf_counter() - t
        model.generation_config.eos_token_id = model.config.eos_token_id
        model.save_pretrained(Path(args.models) / name)
        print(f"{name}: built in {built:.1f}s, saved in {time.perf_counter() - t - built:.1f}s "
              f"to {Path(args.models) / name}", flush=True)


def _drop_cached(folder: Path) -> None:
    """The model's files out of the page cache, so the next load reads the disk."""
    for f in folder.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def load(folder: Path, tiny: bool):
    """As the book loads a hub model (``models._from_pretrained``): (model, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM
    _drop_cached(folder)
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32 if tiny else torch.bfloat16, trust_remote_code=False)
    model = model.to(_device(tiny)).eval()
    if not tiny:
        torch.cuda.synchronize()
    return model, time.perf_counter() - t


class Facts:
    """What one worker measured, one JSON file per worker and step."""

    def __init__(self, folder: Path, step: str):
        import torch
        self.folder, self.step = folder, step
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.path = folder / f"_facts-{step}-{rank}-{os.getpid()}.json"
        self.data = {"step": step, "rank": rank, "loads": [], "setups": [], "work": [],
                     "t_start": time.time()}

    def save(self) -> None:
        self.data["t_end"] = time.time()
        self.path.write_text(json.dumps(self.data))


def _digest(ids) -> str:
    return hashlib.sha256(json.dumps([int(i) for i in ids]).encode()).hexdigest()[:16]


# stages ----------------------------------------------------------------------------
def _random_ids(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


def _decode_stage(args, out: Path, sz: dict, shards: list, step: str) -> None:
    """Shards of (model, requests) through ``decoding.generate``, shared among workers."""
    from rlprobe_nb.generation import decoding
    models = Path(args.models)
    compiled = step == "gen" and not args.tiny

    def task(share, state):
        facts, held = Facts(out, step), {}
        for name, key, requests in share:
            if name not in held:
                held.clear()
                decoding.release()
                held[name], secs = load(models / name, args.tiny)
                facts.data["loads"].append(secs)
                t = time.perf_counter()  # the engine's set-up: compilation, graph capture
                decoding.generate(held[name], requests[:sz["slots"]], EOS, slots=sz["slots"],
                                  compiled=compiled, finish=lambda ids: "setup")
                facts.data["setups"].append(time.perf_counter() - t)
            t = time.perf_counter()
            results = decoding.generate(held[name], requests, EOS, slots=sz["slots"],
                                        compiled=compiled)
            secs = time.perf_counter() - t
            tokens = sum(len(ids) for ids, _ in results)
            facts.data["work"].append({"shard": key, "seconds": secs, "tokens": tokens,
                                       "requests": len(requests)})
            (out / f"{key}.json").write_text(json.dumps([_digest(ids) for ids, _ in results]))
        held.clear()
        decoding.release()
        facts.save()

    distributed.run_sharded(task, shards, args.workers)


def stage_gen(args, out: Path, sz: dict) -> dict:
    from rlprobe_nb.generation import decoding
    from rlprobe_nb.generation.rollouts import SHARD_BATCHES, sample_seed
    vocab = _cfg(args.tiny).vocab_size
    prompts = _random_ids(sz["problems"], sz["prompt_len"], vocab, seed=5)
    per_chunk = max(1, SHARD_BATCHES * sz["slots"] // sz["samples"])
    shards = []
    for name in ("ref", "ckpt"):
        for c in range(0, len(prompts), per_chunk):
            reqs = [decoding.Request(tuple(prompts[p]), 0.0 if s == 0 else 0.7,
                                     sample_seed(0, f"p{p}", s), sz["max_new"])
                    for p in range(c, min(len(prompts), c + per_chunk)) for s in range(sz["samples"])]
            shards.append((name, f"gen-{name}-{c:04d}", reqs))
    _decode_stage(args, out, sz, shards, "gen")
    return {"models": 2, "requests": sum(len(r) for *_, r in shards)}


def stage_cont(args, out: Path, sz: dict) -> dict:
    from rlprobe_nb.generation import decoding
    vocab = _cfg(args.tiny).vocab_size
    ctx = _random_ids(sz["contexts"], sz["prompt_len"] + sz["prefix_len"], vocab, seed=6)
    shards = []
    for name in ("ckpt", "ref"):  # the checkpoint, then the reference, as 08's plan sorts
        mine = ctx[: len(ctx) // 2] if name == "ckpt" else ctx[len(ctx) // 2:]
        for c in range(0, len(mine), sz["per_shard"]):
            reqs = [decoding.Request(tuple(ids), 0.7, 1000 * c + 16 * j + s, sz["cont_tokens"])
                    for j, ids in enumerate(mine[c:c + sz["per_shard"]]) for s in range(sz["n"])]
            shards.append((name, f"cont-{name}-{c:04d}", reqs))
    _decode_stage(args, out, sz, shards, "cont")
    return {"models": 2, "requests": sum(len(r) for *_, r in shards)}


def stage_force(args, out: Path, sz: dict) -> dict:
    from random_models import make_sequences
    from rlprobe_nb import forcing
    from rlprobe_nb.forcing import sharded
    seqs = make_sequences(sz["rollouts"], sz["prompt_len"], sz["response_len"],
                          _cfg(args.tiny).vocab_size, seed=9)
    models, device = Path(args.models), _device(args.tiny)
    hdir = out / "hidden-ref"
    kw = dict(batch_tokens=sz["batch_tokens"], chunk_positions=1024, topk=5, suite="bench",
              device=device)

    def load_ref():
        facts = Facts(out, "force-ref")
        model, secs = load(models / "ref", args.tiny)
        facts.data["loads"].append(secs)
        facts.save()
        side = forcing.Side("ref", model, None, hdir)
        return side, side

    t = time.perf_counter()
    sharded.run_pair(seqs, ("ref", "ref"), None, load_ref, forwarded={"ref": hdir},
                     workers=args.workers, key={"bench": "8b"}, provenance={"bench": "8b"}, **kw)
    ref_wall = time.perf_counter() - t
    names = [f"ckpt{i}" for i in range(sz["checkpoints"])]

    def task(share, state):
        facts = Facts(out, "force-ckpt")
        for name in share:
            model, secs = load(models / "ckpt", args.tiny)
            facts.data["loads"].append(secs)
            t = time.perf_counter()
            forcing.run_checkpoint(seqs, forcing.Side(name, model), forcing.Side("ref", cache_dir=hdir),
                                   out / f"tokens-{name}", progress=False, key={"bench": "8b"},
                                   provenance={"bench": "8b"}, **kw)
            facts.data["work"].append({"checkpoint": name, "seconds": time.perf_counter() - t,
                                       "rows": seqs.n_rows()})
            del model
        facts.save()

    distributed.run_sharded(task, names, args.workers)
    return {"models": 1 + len(names), "rows_per_model": seqs.n_rows(),
            "reference_wall_seconds": ref_wall, "checkpoints": names}


STAGES = {"gen": stage_gen, "force": stage_force, "cont": stage_cont}


def stage(args) -> dict:
    sz = _sizes(args)
    out = Path(args.out) / f"{args.stage}_w{args.workers}"
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    extra = STAGES[args.stage](args, out, sz)
    wall = time.perf_counter() - t
    facts = [json.loads(p.read_text()) for p in sorted(out.glob("_facts-*.json"))]
    result = {"stage": args.stage, "workers": args.workers, "card": _card(args.tiny),
              "wall_seconds": wall, "sizes": sz, **extra, "facts": facts}
    if args.stage == "force":
        from rlprobe_nb.tables import storage
        result["engine"] = {n: storage.read_manifest(out / f"tokens-{n}")["engine"]
                            for n in extra["checkpoints"]}
    (Path(args.out) / f"{args.stage}_w{args.workers}.json").write_text(
        json.dumps(result, indent=1, default=str))
    print(f"{args.stage} on {args.workers} worker(s) [{result['card']}]: wall {wall:.1f}s; "
          + "; ".join(f"{f['step']}#{f['rank']} loads {[round(x, 1) for x in f['loads']]} "
                      f"setups {[round(x, 1) for x in f['setups']]} work "
                      f"{[round(w['seconds'], 1) for w in f['work']]}" for f in facts), flush=True)
    return result


# report ----------------------------------------------------------------------------
def _equal(results: Path, name: str, a: int, b: int) -> dict:
    """Outputs of the a- and b-worker runs: generated ids (digests) equal per request;
    token tables: ids and every exact column equal, metrics within 1e-5 (bench_gpus)."""
    da, db = results / f"{name}_w{a}", results / f"{name}_w{b}"
    if name != "force":
        files = sorted(p.name for p in da.glob(f"{name}-*.json"))
        same = [json.loads((da / f).read_text()) == json.loads((db / f).read_text())
                for f in files if (db / f).exists()]
        return {"shards": len(files), "shards_compared": len(same), "ids_equal": all(same)
                and len(same) == len(files) > 0}
    from bench_gpus import compare
    from rlprobe_nb.tables import storage
    out = {}
    for folder in sorted(da.glob("tokens-*")):
        out[folder.name] = compare(storage.read_table(folder), storage.read_table(db / folder.name))
    return {"tables": out, "ids_equal": bool(out) and all(v["token_ids_equal"] and v["exact_columns_equal"]
                                                          for v in out.values()),
            "metrics_within_1e-5": bool(out) and all(v.get("metrics_within_1e-5") for v in out.values())}


def _measured(r: dict) -> dict:
    """One stage run's parameters for the formula: load seconds, the set-up of a
    process's first model and of a later one, one worker's rate, worker start."""
    facts = r["facts"]
    loads = [x for f in facts for x in f["loads"]]
    setups = [x for f in facts for x in f["setups"]]
    unit = "rows" if r["stage"] == "force" else "tokens"
    rates = []
    for f in facts:
        if f["work"]:
            rates.append(sum(w[unit] for w in f["work"]) / sum(w["seconds"] for w in f["work"]))
    spans = {}
    for f in facts:  # each step's slowest worker
        spans[f["step"]] = max(spans.get(f["step"], 0.0), f["t_end"] - f["t_start"])
    if "reference_wall_seconds" in r:  # force: the reference's step, load and forward, whole
        spans["force-ref"] = r["reference_wall_seconds"]
    firsts = [f["setups"][0] for f in facts if f["setups"]]
    later = [x for f in facts for x in f["setups"][1:]]
    return {"t_load": sum(loads) / len(loads), "loads": loads, "setups": setups,
            "t_setup_first": max(firsts) if firsts else 0.0,
            "t_setup_next": (sum(later) / len(later)) if later else (max(firsts) if firsts else 0.0),
            "rate_per_worker": sum(rates) / len(rates), "unit": unit,
            "start": max(0.0, r["wall_seconds"] - sum(spans.values()))}


def _chapter(m: dict, W: int, loads: int, work: float, setups: bool = True) -> dict:
    """T(W) = S + L * t_load + t_setup_first + (L - 1) * t_setup_next + U / (W * r), its
    terms in seconds."""
    setup = (m["t_setup_first"] + (loads - 1) * m["t_setup_next"]) if setups else 0.0
    parts = {"start": m["start"], "loads": loads * m["t_load"], "setup": setup,
             "work": work / (W * m["rate_per_worker"])}
    return {**parts, "total": sum(parts.values())}


def _hours(stage: str, m: dict, W: int, full: dict = FULL) -> dict:
    """Per book chapter, the formula's terms (seconds) at full size on W GPUs."""
    F, cap = full, full["max_new_tokens"]
    if stage == "gen":
        u01 = F["problems_01"] * F["answers_per_problem_01"] * cap * F["models_01"]
        u02 = F["problems_02"] * F["rollouts_per_problem_02"] * cap
        return {"01": _chapter(m, W, math.ceil(F["models_01"] / W), u01),
                "02": _chapter(m, W, 1, u02)}
    if stage == "cont":
        u = F["contexts_08"] * F["n_08"] * F["continuation_tokens_08"]
        return {"08": _chapter(m, W, math.ceil(F["models_08"] / W), u)}
    # 03: the reference's batches shared by W workers, then the checkpoints one per
    # worker in ceil(checkpoints / W) rounds (each a load and a whole forward)
    rows = F["problems_02"] * F["rollouts_per_problem_02"] * cap
    rounds = math.ceil(F["checkpoints_03"] / W)
    ref = _chapter(m, W, 1, rows, setups=False)
    ckpts = _chapter(m, 1, rounds, rounds * rows, setups=False)
    parts = {k: ref[k] + ckpts[k] for k in ("loads", "setup", "work")}
    parts["start"] = 2 * m["start"]
    return {"03": {**parts, "total": sum(parts.values())}}


def report(args) -> dict:
    results = Path(args.results)
    runs = {p.stem: json.loads(p.read_text()) for p in results.glob("*_w*.json")}
    out = {"full_sizes": FULL,
           "formula": "T(W) = S(W) + L(W) * t_load + t_setup_first + (L(W) - 1) * t_setup_next"
                      " + U / (W * r_W)",
           "stages": {}, "hours": {}}
    for name in STAGES:
        ws = sorted(r["workers"] for k, r in runs.items() if r["stage"] == name)
        if not ws:
            continue
        st = {"card": runs[f"{name}_w{ws[0]}"]["card"], "runs": {}}
        for w in ws:
            r = runs[f"{name}_w{w}"]
            st["runs"][w] = {"wall_seconds": r["wall_seconds"], "sizes": r["sizes"],
                             "measured": _measured(r)}
        if len(ws) > 1:
            a, b = ws[0], ws[-1]
            st["speedup_wall"] = st["runs"][a]["wall_seconds"] / st["runs"][b]["wall_seconds"]
            st["equal"] = _equal(results, name, a, b)
        out["stages"][name] = st
        for W in (1, 2, 4):  # unmeasured W: the nearest run below it (else the smallest)
            near = max([w for w in ws if w <= W] or ws[:1])
            m = st["runs"][near]["measured"]
            out.setdefault("basis", {}).setdefault(name, {})[W] = (
                "measured" if W in ws else f"extrapolated from the {near}-GPU run")
            for chapter, terms in _hours(name, m, W).items():
                out["hours"].setdefault(chapter, {})[W] = terms["total"] / 3600
                out.setdefault("seconds_by_term", {}).setdefault(chapter, {})[W] = terms
    for chapter, by_w in out["hours"].items():
        if 1 in by_w and 2 in by_w:
            by_w["speedup_2"] = by_w[1] / by_w[2]
    cards = sorted({st["card"] for st in out["stages"].values()})
    out["cards"] = cards
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    print(f"\ncards: {', '.join(cards)}")
    print(f"{'stage':<6} {'W':>2} {'wall s':>8} {'t_load':>7} {'setup 1st/next':>15} "
          f"{'rate/worker':>12} {'start':>6}")
    for name, st in out["stages"].items():
        for w, r in st["runs"].items():
            m = r["measured"]
            print(f"{name:<6} {w:>2} {r['wall_seconds']:>8.1f} {m['t_load']:>7.1f} "
                  f"{m['t_setup_first']:>7.1f}/{m['t_setup_next']:<7.1f} "
                  f"{m['rate_per_worker']:>9,.0f} {m['unit']:<4} {m['start']:>6.1f}")
        if "speedup_wall" in st:
            print(f"{name:<6} speed-up (wall) {st['speedup_wall']:.2f}x, outputs equal: {st['equal']['ids_equal']}"
                  + (f", metrics within 1e-5: {st['equal']['metrics_within_1e-5']}"
                     if name == "force" else ""))
    print("\nparams/tulu3 at full size (responses at their cap), hours per chapter; "
          f"the formula's parameters: {json.dumps(out.get('basis', {}))}")
    for chapter in sorted(out["hours"]):
        h = out["hours"][chapter]
        print(f"  {chapter}: " + ", ".join(f"{w} GPU{'s' if w > 1 else ''} {h[w]:.2f} h"
                                           for w in (1, 2, 4) if w in h)
              + (f"; 2 vs 1: {h['speedup_2']:.2f}x" if "speedup_2" in h else ""))
        t = out["seconds_by_term"][chapter][1]
        print("      on 1 GPU, seconds: " + ", ".join(f"{k} {v:,.0f}" for k, v in t.items()))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("verb", choices=["prepare", "stage", "report", "all"])
    ap.add_argument("stage", nargs="?", choices=list(STAGES))
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny shape: a dry run")
    ap.add_argument("--models", default=None, help="folder of the saved models")
    ap.add_argument("--only", choices=["ref", "ckpt"], help="prepare one model")
    ap.add_argument("--out", default=None, help="results folder (stage)")
    ap.add_argument("--results", default=None, help="results folder (report)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=192)
    ap.add_argument("--problems", type=int, default=7, help="gen: problems per model")
    ap.add_argument("--rollouts", type=int, default=1024, help="force: forced sequences")
    ap.add_argument("--response-len", type=int, default=640, help="force: response tokens")
    ap.add_argument("--checkpoints", type=int, default=2, help="force: checkpoints")
    ap.add_argument("--contexts", type=int, default=8, help="cont: contexts (both models)")
    ap.add_argument("--prefix-len", type=int, default=256, help="cont: rollout prefix tokens")
    args = ap.parse_args(argv)
    if args.verb == "prepare":
        return prepare(args)
    if args.verb == "stage":
        return stage(args)
    if args.verb == "report":
        return report(args)
    # all: a dry run of every verb in one temporary folder
    root = Path(args.out or tempfile.mkdtemp(prefix="bench_8b_"))
    args.models, args.results = str(root / "models"), str(root)
    prepare(args)
    for workers in (1, int(os.environ.get(distributed.PROCESSES_ENV, "2"))):
        for name in STAGES:
            args.stage, args.workers, args.out = name, workers, str(root)
            stage(args)
    return report(args)


if __name__ == "__main__":
    main()

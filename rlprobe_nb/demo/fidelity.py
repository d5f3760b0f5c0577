"""How close the shipped 8-bit adapters are to the run's own: forced log-probs compared.

A few of the reference's wrong sampled answers from the run's evaluation are forced
through every model twice, once with the original (bf16) adapters and once with the
shipped ones, on the same float32 base; the written tokens' log-probs are kept side by
side (``fidelity.parquet``), so a test can force them again through the book's own
loader and hold the shipped models to the original run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

COLUMNS = ["model", "rollout", "pos", "token_id", "logp_original", "logp_shipped"]


@dataclass
class FidelityCheck:
    table: pd.DataFrame
    summary: dict = field(default_factory=dict)


def fidelity_rollouts(rows: pd.DataFrame, n: int) -> pd.DataFrame:
    """The reference's wrong sampled answers that ended by themselves, one per problem,
    from the first ``n`` such problems in id order."""
    wrong = rows[(rows["model"] == "dpo") & (rows["sample"] > 0) & ~rows["correct"].astype(bool)
                 & (rows["finish_reason"] == "stop")]
    return (wrong.sort_values(["problem_id", "sample"]).drop_duplicates("problem_id")
            .head(n).reset_index(drop=True))


def sequences(tokenizer, rollouts: pd.DataFrame, stop_id: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + the stop token) of each rollout, as the run prompted."""
    from rlprobe_nb.problems import arithmetic
    from rlprobe_nb.suite import prompting

    # the test split is drawn in id order (seed 0, as the run's evaluation drew it)
    needed = 1 + max(int(pid.rsplit("/", 1)[1]) for pid in rollouts["problem_id"])
    by_id = {p["unique_id"]: p for p in arithmetic.generate_problems("test", needed, 0)}
    return [(prompting.prompt_ids(tokenizer, by_id[r.problem_id]["problem"]),
             [int(t) for t in tokenizer(r.response, add_special_tokens=False)["input_ids"]]
             + [int(stop_id)]) for r in rollouts.itertuples()]


def written_logprobs(model, seqs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """log p(response token k | prefix) for every response token, in float64 from the
    float32 logits."""
    import torch

    out = []
    with torch.no_grad():
        for prompt, response in seqs:
            ids = torch.tensor([prompt + response])
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)
            rows = logp[len(prompt) - 1:len(prompt) - 1 + len(response)]
            out.append(rows.gather(1, torch.tensor(response)[:, None])[:, 0].tolist())
    return out


def _merged(model, folder: Path):
    from peft import PeftModel

    return PeftModel.from_pretrained(copy.deepcopy(model), str(folder)).merge_and_unload().eval()


def measure(originals: dict[str, Path], shipped_root: Path, rows: pd.DataFrame, n: int,
            stop_token: str) -> FidelityCheck:
    """Forced log-probs of ``n`` rollouts under every original and shipped adapter."""
    from rlprobe_nb.suite import compact_adapters, gguf_cache, paths

    base, tok = gguf_cache.demo_model()
    picked = fidelity_rollouts(rows, n)
    seqs = sequences(tok, picked, tok.convert_tokens_to_ids(stop_token))
    cache = paths.cache_dir() / "adapters"
    refs = {"original": _merged(base, originals["dpo"]),
            "shipped": _merged(base, compact_adapters.loadable(shipped_root / "dpo", cache))}
    frames = []
    for name in originals:
        logps = {}
        for side, folder in (("original", originals[name]),
                             ("shipped", compact_adapters.loadable(shipped_root / name, cache))):
            model = refs[side] if name == "dpo" else _merged(refs[side], folder)
            logps[side] = written_logprobs(model, seqs)
        names = picked["problem_id"] + "#" + picked["sample"].astype(str)
        for rollout, (_, response), orig, ship in zip(names, seqs, logps["original"],
                                                       logps["shipped"]):
            frames.append(pd.DataFrame({"model": name, "rollout": rollout,
                                        "pos": range(len(response)), "token_id": response,
                                        "logp_original": orig, "logp_shipped": ship}))
    table = pd.concat(frames, ignore_index=True)[COLUMNS]
    gap = (table["logp_shipped"] - table["logp_original"]).abs()
    summary = {"rollouts": len(seqs), "tokens_per_model": int(len(table) / len(originals)),
               "max_abs_logp_gap": float(gap.max()), "mean_abs_logp_gap": float(gap.mean()),
               "p99_abs_logp_gap": float(gap.quantile(0.99)),
               "max_abs_logp_gap_by_model": gap.groupby(table["model"]).max().round(6).to_dict()}
    return FidelityCheck(table, summary)

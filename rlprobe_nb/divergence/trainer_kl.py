"""The KL a trainer logged beside the book's exact KL on the same checkpoint.

What trainers log (README "Bring your own run"): TRL GRPO's ``kl`` and verl's
``actor/kl_loss`` are the token mean of k3 = exp(ref − logp) − (ref − logp) − 1 over the
policy's *own* samples, an estimate of KL(π‖ref), the mirror of the book's k3 (which is
computed on the reference's samples and estimates KL(ref‖ckpt)). The value logged at step
N+1 is computed before update N+1, from the weights saved as checkpoint N, on logits divided
by the sampling temperature. Its exact counterpart in the book is the token mean of
``kl_ckpt_ref`` over checkpoint N's own samples (the run's dump N+1, imported with
``import_rollouts`` and forced), at T = 1.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

LOG_COLUMNS = ["step", "kl", "entropy", "source"]
VERL_KEYS = {"kl": "actor/kl_loss", "entropy": "actor/entropy"}


def trl_log(run_dir: Path) -> pd.DataFrame:
    """``log_history`` of the last ``checkpoint-N/trainer_state.json`` (it holds every
    earlier step's entries too): one row per logged step."""
    states = sorted(Path(run_dir).glob("checkpoint-*/trainer_state.json"),
                    key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    if not states:
        raise FileNotFoundError(f"{run_dir}: no checkpoint-N/trainer_state.json (a TRL run "
                                "folder holds them)")
    history = json.loads(states[-1].read_text()).get("log_history", [])
    rows = [{"step": int(h["step"]), "kl": h.get("kl"), "entropy": h.get("entropy"),
             "source": f"{states[-1]} log_history"} for h in history if "step" in h
            and ("kl" in h or "entropy" in h)]
    return pd.DataFrame(rows, columns=LOG_COLUMNS)


def verl_log(path: Path) -> pd.DataFrame:
    """verl's file logger (``trainer.logger`` with "file"): lines ``{"step", "data"}``."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            data = entry.get("data", {})
            rows.append({"step": int(entry["step"]), "kl": data.get(VERL_KEYS["kl"]),
                         "entropy": data.get(VERL_KEYS["entropy"]), "source": str(path)})
    return pd.DataFrame(rows, columns=LOG_COLUMNS)


def beside(log: pd.DataFrame, tokens: pd.DataFrame, checkpoint_step: int,
           temperature: float, trainer: str) -> pd.DataFrame:
    """One row: the trainer's KL and entropy logged at ``checkpoint_step`` + 1 beside the
    book's exact values on ``tokens`` (checkpoint ``checkpoint_step`` forced on its own
    samples against the reference), with what differs between them said in words."""
    at = log[log.step == checkpoint_step + 1]
    logged = at.iloc[-1] if len(at) else None
    dlogp = tokens["dlogp"].to_numpy(np.float64)
    mirrored_k3 = np.exp(-dlogp) + dlogp - 1  # the trainer's estimator, on these tokens
    row = {"checkpoint_step": checkpoint_step, "trainer_step": checkpoint_step + 1,
           "logged_kl": _num(logged, "kl"), "exact_kl_ckpt_ref": float(tokens.kl_ckpt_ref.mean()),
           "trainer_k3_on_these_tokens": float(mirrored_k3.mean()),
           "logged_entropy": _num(logged, "entropy"),
           "exact_entropy_ckpt": float(tokens.entropy_ckpt.mean()),
           "tokens": len(tokens), "rollouts": int(tokens.rollout_id.nunique()),
           "temperature": temperature, "note": note(trainer, checkpoint_step, temperature,
                                                     logged is not None)}
    return pd.DataFrame([row])


def _num(row, key) -> Optional[float]:
    if row is None or row.get(key) is None or pd.isna(row.get(key)):
        return None
    return float(row[key])


def note(trainer: str, step: int, temperature: float, found: bool) -> str:
    parts = [f"{trainer} logged its KL at step {step + 1} before update {step + 1}, from the "
             f"weights saved as checkpoint {step}, as the token mean of k3 on the policy's own "
             "samples: an estimate of KL(π‖ref). The book's exact value is the token mean of "
             f"kl_ckpt_ref (KL(ckpt‖ref)) over checkpoint {step}'s own samples, forced at T = 1 "
             "(the mirror of the book's own k3, which is measured on the reference's samples)."]
    if not found:
        parts.append(f"The trainer's log has no entry at step {step + 1}.")
    if math.isnan(temperature):
        parts.append("The sampling temperature is unknown: the trainer divided its logits by "
                     "it, so the two agree only if it was 1.")
    elif temperature != 1.0:
        parts.append(f"The run sampled at T = {temperature:g} and the trainer divided its "
                     "logits by it; the book's values are at T = 1, so they are not comparable.")
    parts.append("Re-tokenized text (token_method text) can differ from the ids the policy "
                 "sampled; the trainer also averages over a whole batch, the book over the "
                 "imported rows.")
    return " ".join(parts)

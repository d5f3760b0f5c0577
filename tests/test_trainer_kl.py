"""The trainers' logs read as (step, kl, entropy), and the KL beside the exact one."""

import json
import math

import numpy as np
import pandas as pd

from rlprobe_nb.divergence import trainer_kl


def test_verl_file_logger_and_the_row_beside(tmp_path):
    log_file = tmp_path / "exp.jsonl"
    log_file.write_text("".join(json.dumps({"step": s, "data": {
        "actor/kl_loss": 0.01 * s, "actor/entropy": 1.5, "critic/score/mean": 0.2}}) + "\n"
        for s in (1, 2, 3)))
    log = trainer_kl.verl_log(log_file)
    assert log.step.tolist() == [1, 2, 3] and log.kl.tolist() == [0.01, 0.02, 0.03]
    dlogp = np.array([0.1, -0.2, 0.05, 0.0])
    tokens = pd.DataFrame({"dlogp": dlogp, "kl_ckpt_ref": [0.02, 0.01, 0.03, 0.0],
                           "entropy_ckpt": [1.0, 2.0, 1.5, 0.5], "rollout_id": ["a", "a", "b", "b"]})
    row = trainer_kl.beside(log, tokens, 2, float("nan"), "verl").iloc[0]
    assert (row.trainer_step, row.logged_kl, row.logged_entropy) == (3, 0.03, 1.5)
    assert row.exact_kl_ckpt_ref == 0.015 and row.rollouts == 2 and row.tokens == 4
    assert math.isclose(row.trainer_k3_on_these_tokens, float(np.mean(np.exp(-dlogp) + dlogp - 1)))
    assert "temperature is unknown" in row.note
    missing = trainer_kl.beside(log, tokens, 5, 1.0, "verl").iloc[0]
    assert missing.logged_kl is None and "no entry at step 6" in missing.note

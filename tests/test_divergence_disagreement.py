"""Chapter 04's disagreement map on a hand-built token table: a disagreement is where the
checkpoint's top-1 is a real alternative to the written token (a layout variant is
none), shares by label with intervals over problems, and where the choice ranks in the
reference's top-k."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rlprobe_nb.divergence import disagreement

TEXT = {1: "4", 2: "4\n", 3: "7", 4: "+", 5: " the", 6: "-", 7: "9", 8: "<eos>"}


def tokens(n_problems: int = 6):
    rows = []
    for p in range(n_problems):
        for ckpt, step in (("rl", 100), ("pl", 100)):
            for pos, (written, ck_top, ref_top, label) in enumerate([
                    (5, [5, 1], [5, 1], "other"),        # first token: never read
                    (1, [3, 1], [1, 3], "result_first_wrong"),  # disagrees; ref rank 2
                    (1, [2, 1], [1, 2], "result_first_wrong"),  # a layout variant: agrees
                    (4, [6, 4], [4, 9, 7, 3, 6], "operator"),  # disagrees; ref rank 4..k
                    (4, [4, 6], [4, 6], "operator"),    # agrees
                    (5, [7, 5], [7, 5], "other"),       # disagrees, the reference's top-1 too
                    (5, [8, 5], [5], "other")]):         # EOS is no alternative
                if ckpt == "pl" and pos in (1, 3):
                    ck_top = ref_top  # the placebo keeps the written tokens there
                rows.append({"checkpoint": ckpt, "step": step, "problem_id": f"p{p}",
                             "rollout_id": f"p{p}#0",
                             "pos": pos, "first_token": pos == 0, "token_id": written,
                             "topk_ids_ckpt": ck_top, "topk_ids_ref": ref_top, "label": label})
    return pd.DataFrame(rows)


def test_the_map_counts_real_alternatives_by_label_with_ranks_in_the_references_top_k():
    tok = tokens()
    marked = disagreement.annotate(tok, tok["label"], TEXT.get, special={8})
    assert len(marked) == len(tok) - 12  # first tokens left out
    table = disagreement.map_table(marked, {"rl": "rlvr", "pl": "placebo"}.get, n_boot=200)
    row = table.set_index(["checkpoint", "label"])
    rl_all, pl_all = row.loc[("rl", "all tokens")], row.loc[("pl", "all tokens")]
    assert rl_all.disagreements == 18 and rl_all.positions == 36
    assert np.isclose(rl_all.share, 0.5) and rl_all.low <= 0.5 <= rl_all.high
    assert pl_all.disagreements == 6
    fw = row.loc[("rl", "first wrong digits")]
    assert fw.disagreements == 6 and np.isclose(fw.share, 0.5) and fw.ref_rank_2 == 1.0
    assert row.loc[("rl", "operators")]["ref_rank_4..k"] == 1.0
    other = row.loc[("rl", "other tokens")]
    assert other.disagreements == 6 and other.ref_rank_1 == 1.0 and other.share_new == 0
    assert np.isclose(rl_all.share_new, 12 / 36)
    ranks = disagreement.rank_table(table)
    assert set(ranks["rank"]) <= set(disagreement.RANKS)
    assert "operands" not in set(ranks.label)  # no operand, no disagreement: no row
    with_ref = disagreement.annotate(tok, tok["label"], TEXT.get, special={8}, reference="ref")
    assert len(with_ref) == len(marked) + 36  # the reference once per position
    runs = {"rl": "rlvr", "pl": "placebo", "ref": "reference"}.get
    ref = disagreement.map_table(with_ref, runs, n_boot=200).set_index(["checkpoint", "label"])
    # its own first choice differs from the token drawn only at the " the" it wrote for "9"
    assert ref.loc[("ref", "all tokens")].disagreements == 6
    assert ref.loc[("ref", "other tokens")].disagreements == 6 and ref.loc[("ref", "all tokens")].step == 0
    assert "reference" not in set(disagreement.rank_table(ref.reset_index()).run)
    shown = disagreement.display_frame(ref.reset_index(), lambda e, lo, hi, n: f"{e:.2f}")
    assert list(shown.label.unique())[0] == "all tokens" and "reference: share" in shown
    said = disagreement.sentence(table, lambda x: f"{x:.2f}",
                                 lambda e, lo, hi, n: f"{e:.2f} [{lo:.2f}, {hi:.2f}]")
    assert "18 of 36" in said and "6 of 36" in said

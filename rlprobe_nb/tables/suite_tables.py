"""Every per-token table of a suite in one call, checked current, for chapters 04 on.

``read_tokens(P)`` concatenates the tables of each RLVR checkpoint against the reference
(written by notebook 03, one run per checkpoint; the placebo run's checkpoints only when
asked: ``pairs=placebo_pairs(P)``), adds the checkpoint's RL ``step``, and
refuses a table that is damaged or was computed from other inputs than the current ones
(``lineage.current_sha``: naming what changed and the run of 03 to redo). Checkpoints not
forced yet are named; with none forced at all it stops at once.
"""

from __future__ import annotations

import pandas as pd

from rlprobe_nb.suite import paths
from rlprobe_nb.suite.params import Params
from rlprobe_nb.tables import lineage, storage


class NothingForcedError(FileNotFoundError):
    """No checkpoint of the suite has a token table yet."""


def _folder(P: Params, checkpoint: str, reference: str):
    return paths.table_dir(P.suite, paths.token_table_name(checkpoint, reference))


def missing_runs(P: Params, pairs: list[tuple[str, str]]) -> list[str]:
    """The 03 commands that would write the tables of ``pairs`` still missing."""
    return [f"papermill notebooks/03_teacher_forcing.ipynb out.ipynb -p suite {P.suite} "
            f"-p checkpoint {c}" for c, r in pairs
            if not storage.is_complete(_folder(P, c, r))]


def placebo_pairs(P: Params) -> list[tuple[str, str]]:
    """(placebo checkpoint, reference) for every placebo of the suite (none: an empty list)."""
    return [(c, P.reference) for c in P.placebos]


def read_tokens(P: Params, pairs: list[tuple[str, str]] | None = None,
                columns: list[str] | None = None) -> pd.DataFrame:
    """The token tables of ``pairs`` (default: every checkpoint vs the reference), current
    and intact, as one frame with a ``step`` column (the checkpoint's RL step)."""
    pairs = pairs or [(c, P.reference) for c in P.checkpoints]
    missing = missing_runs(P, pairs)
    if len(missing) == len(pairs):
        raise NothingForcedError(
            f"no token table of suite {P.suite!r} yet: run notebook 03 first, e.g.\n  "
            + "\n  ".join(missing))
    if missing:
        print(f"{len(missing)} of {len(pairs)} checkpoints are not forced yet (left out):\n  "
              + "\n  ".join(missing))
    frames = []
    for ckpt, ref in pairs:
        if not storage.is_complete(_folder(P, ckpt, ref)):
            continue
        df, _ = lineage.read_current(P, paths.token_table_name(ckpt, ref), columns=columns)
        frames.append(df.assign(step=P.steps.get(ckpt, 0)))
    return pd.concat(frames, ignore_index=True)


# What a reader calls each run of a suite (the ``run`` of ``accuracy_table``).
RUN_NAMES = {"reference": "reference", "rlvr": "RLVR", "placebo": "placebo (reward permuted)"}


def _run(P: Params, model: str) -> str:
    return "reference" if model == P.reference else P.run_of(model)


def accuracy_table(P: Params) -> pd.DataFrame:
    """Accuracy per model of the suite with its 95% interval, x = RL step (the reference
    at 0): the suite's recorded evaluation (``data/<suite>/shipped/run/accuracy.csv``,
    greedy answers, Wilson interval) where it exists, else what notebook 01 measured for
    the reference and the target (all answers; Wilson). Columns: model, run (``RUN_NAMES``:
    the reference, the RLVR run, the placebo run), step, rate, low, high, n, source."""
    from rlprobe_nb import statistics

    recorded = paths.shipped_dir(P.suite) / "run" / "accuracy.csv"
    if recorded.exists():
        acc = pd.read_csv(recorded)
        ci = [statistics.wilson_ci(int(k), int(n))
              for k, n in zip(acc["greedy_correct"], acc["problems"])]
        run = acc["run"] if "run" in acc else acc["model"].map(lambda m: _run(P, m))
        return pd.DataFrame({
            "model": acc["model"],
            "run": [RUN_NAMES["reference"] if m == P.reference else RUN_NAMES.get(r, str(r))
                    for m, r in zip(acc["model"], run)],
            "step": acc["step"].astype(int),
            "rate": acc["greedy_correct"] / acc["problems"], "low": [c[0] for c in ci],
            "high": [c[1] for c in ci], "n": acc["problems"],
            "source": f"recorded evaluation ({recorded.name}, greedy, Wilson)"})
    answers, _ = lineage.read_current(P, "answers")
    table = statistics.rate_table(answers, ["model"], cluster=None)
    steps = {P.reference: 0, **P.steps}
    return pd.DataFrame({
        "model": table["model"],
        "run": [RUN_NAMES[_run(P, m)] for m in table["model"]],
        "step": table["model"].map(steps).astype("Int64"),
        "rate": table["rate"], "low": table["wilson_low"], "high": table["wilson_high"],
        "n": table["n"], "source": "notebook 01 (all answers, Wilson)"})

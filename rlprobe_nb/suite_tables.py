"""Every per-token table of a suite in one call, checked current, for chapters 04 on.

``read_tokens(P)`` concatenates the tables of each RLVR checkpoint against the reference
(written by notebook 03, one run per checkpoint), adds the checkpoint's RL ``step``, and
refuses a table that is damaged or was computed from other inputs than the current ones
(naming what changed and the run of 03 to redo). Checkpoints not forced yet are named;
with none forced at all it stops at once.
"""

from __future__ import annotations

import pandas as pd

from . import forcing, storage, suite_keys
from .params import Params


class NothingForcedError(FileNotFoundError):
    """No checkpoint of the suite has a token table yet."""


def missing_runs(P: Params, pairs: list[tuple[str, str]]) -> list[str]:
    """The 03 commands that would write the tables of ``pairs`` still missing."""
    return [f"papermill notebooks/03_teacher_forcing.ipynb out.ipynb -p suite {P.suite} "
            f"-p checkpoint {c}" for c, r in pairs
            if not storage.is_complete(forcing.pair_dir(P.suite, c, r))]


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
        folder = forcing.pair_dir(P.suite, ckpt, ref)
        if not storage.is_complete(folder):
            continue
        suite_keys.tokens_current(P, ckpt, ref, folder)
        df = storage.read_table(folder, columns=columns)
        frames.append(df.assign(step=P.steps.get(ckpt, 0)))
    return pd.concat(frames, ignore_index=True)

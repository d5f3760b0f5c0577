"""How many rows of a demo token table a change of batch size moves, and by how much
(rlprobe_nb.forcing.precision.batch_effect), on the demo's own forced set.

    RLPROBE_OUT=<folder holding data/demo> python benchmarks/batch_effect_demo.py \
        [--checkpoint rlvr_step_1200] [--batch-tokens 4096 1024] [--limit N]

Reads the demo's problems, selection and rollouts tables (as a built demo book left them),
chooses the forced rollouts as chapter 03 does, and computes the checkpoint's token table
at each batch size on the CPU; prints, per metric, the share of rows that moved and the
largest change (in nats, and scaled as BATCH_TOLERANCE holds it).
"""

import argparse

import pandas as pd

from rlprobe_nb.forcing import plan, precision
from rlprobe_nb.suite import models, params, paths
from rlprobe_nb.tables import storage


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoint", default="rlvr_step_1200")
    ap.add_argument("--batch-tokens", type=int, nargs=2, default=[4096, 1024])
    ap.add_argument("--limit", type=int, default=None, help="force only the first N sequences")
    args = ap.parse_args()
    P = params.load("demo", args.checkpoint, overrides={"runtime.device": "cpu"})
    read = lambda name: storage.read_table(paths.table_dir("demo", name))  # noqa: E731
    chosen = plan.choose(read("rollouts"), read("selection"), P)
    seqs = plan.sequences(P, chosen, read("problems"))
    if args.limit:
        seqs = type(seqs)(seqs.sequences[:args.limit])
    ref, ckpt = models.load_model(P.reference, P), models.load_model(args.checkpoint, P)
    chunk = P.forcing.chunk_positions
    table = precision.batch_effect(seqs, ckpt.model, ref.model,
                                   sizes=tuple((b, chunk) for b in args.batch_tokens))
    pd.set_option("display.width", 160)
    print(f"{len(seqs.sequences)} rollouts, {seqs.n_rows()} response tokens; batch_tokens "
          f"{args.batch_tokens[1]} against {args.batch_tokens[0]}, float32 on the CPU")
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()

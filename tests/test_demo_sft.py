"""The demo suite's supervised stage: data, batches, the selection rule; and the placebo
reward of its GRPO runs."""

import numpy as np
import pytest
import torch

from rlprobe_nb.demo import grpo, sft
from rlprobe_nb.demo.tiny import tiny_tokenizer


def _e(step, boxed, acc):
    return {"step": step, "boxed": boxed, "accuracy": acc}


@pytest.mark.parametrize("evals, step, why", [
    ([_e(25, 0.5, 0.1), _e(50, 0.98, 0.3), _e(100, 0.99, 0.4), _e(200, 1.0, 0.6)], 100,
     "latest in range"),
    ([_e(25, 0.99, 0.6), _e(50, 1.0, 0.7)], 25, "all above range: earliest"),
    ([_e(25, 0.99, 0.1), _e(50, 1.0, 0.2), _e(75, 0.5, 0.3)], 50, "all below range: latest"),
    ([_e(25, 0.5, 0.3), _e(50, 0.9, 0.3), _e(75, 0.8, 0.3)], 50, "no step boxed"),
])
def test_selection_rule(evals, step, why):
    chosen = sft.select_checkpoint(evals, 0.97, (0.25, 0.45))
    assert chosen["step"] == step and chosen["why"].startswith(why)


def test_dev_set_is_held_out_of_training_and_from_the_training_split():
    cfg = sft.SFTConfig(train_problems=300, dev_problems=40)
    train, dev = sft.split_data(cfg)
    assert len(dev) == 40 and len(train) == 300
    assert not {p["canonical"] for p in train} & {p["canonical"] for p in dev}
    assert all(p["unique_id"].startswith("demo/train/") for p in train + dev)


def test_loss_counts_solution_tokens_only():
    tok = tiny_tokenizer()
    problem = {"problem": "What is $2 + 3$?", "solution": "2 + 3 = 5\nThe answer is $\\boxed{5}$."}
    prompt, target = sft.encode(tok, problem)
    assert target[-1] == tok.eos_token_id
    assert tok.decode(target[:-1]) == problem["solution"]
    ids, mask, labels = sft.batch([(prompt, target), (prompt[:3], target[:2])], tok.pad_token_id, "cpu")
    assert labels[0, :len(prompt)].eq(-100).all()
    assert labels[0, len(prompt):len(prompt) + len(target)].tolist() == target
    assert int(mask[1].sum()) == 5 and labels[1, 5:].eq(-100).all()


def test_placebo_reward_keeps_the_values_and_loses_the_order():
    r = np.array([1.0, 1.1, 0.0, 0.1] * 64)
    p = grpo.permuted_rewards(r, seed=0, rnd=3)
    assert sorted(p) == sorted(r)  # same mean and spread
    assert np.array_equal(p, grpo.permuted_rewards(r, seed=0, rnd=3))  # resumable
    assert not np.array_equal(p, grpo.permuted_rewards(r, seed=0, rnd=4))
    # no information left: the permuted reward is uncorrelated with the real one
    corr = [np.corrcoef(r, grpo.permuted_rewards(r, 0, k))[0, 1] for k in range(200)]
    assert abs(np.mean(corr)) < 0.02


def test_permuted_is_a_valid_reward_and_others_are_refused():
    grpo.GRPOConfig(reward="permuted").validate()
    with pytest.raises(ValueError, match="reward"):
        grpo.GRPOConfig(reward="shuffled").validate()


def test_merge_adapter_gives_the_adapted_model(tmp_path):
    from peft import LoraConfig, get_peft_model

    from rlprobe_nb.demo.tiny import tiny_llama

    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=2)
    peft = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = peft(x).logits
    peft.save_pretrained(tmp_path / "a")
    merged = grpo.merge_adapter(tiny_llama(len(tok), seed=2), tmp_path / "a")
    with torch.no_grad():
        got = merged(x).logits
    assert torch.allclose(got, want, atol=1e-5)

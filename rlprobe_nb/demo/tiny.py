"""Tiny stand-ins for tests and CPU dry runs: a byte-level BPE tokenizer with a chat
template (a real tokenizer, ~300 ids, multi-byte characters split across tokens) and tiny
random Llama models with peaked next-token distributions.

Nothing here is downloaded; everything is deterministic given its seed.
"""

from __future__ import annotations

import torch

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|begin_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

_CORPUS = [
    "The answer is 42. Let me think step by step about the problem.",
    "First, we compute the sum: 12 + 30 = 42, so the final answer is \\boxed{42}.",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "What is 7 times 6? We multiply seven by six and get forty-two.",
] * 4


def tiny_tokenizer(vocab_size: int = 300):
    """A byte-level BPE tokenizer (GPT-2 style) with BOS, EOS = <|im_end|>, PAD and a
    ChatML template that starts with BOS. Trained on a fixed corpus: deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|im_end|>",
        pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(vocab_size: int, seed: int = 0, hidden: int = 64, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, init_range: float = 0.3,
               max_positions: int = 512, dtype=torch.float32, attn: str = "sdpa",
               base=None, perturb: float = 0.0):
    """A random LlamaForCausalLM. ``init_range`` 0.3 at hidden 64 gives logits with a
    standard deviation of ~2.4, so distributions are peaked (entropies ~1-3 nats).
    ``base`` + ``perturb``: a copy of ``base`` with N(0, perturb) noise added to every
    weight, which makes KL(P||Q) O(0.1-1) instead of the O(10) of unrelated models."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, initializer_range=init_range,
        tie_word_embeddings=False, attn_implementation=attn)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    if base is not None:
        model.load_state_dict(base.state_dict())
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=gen) * perturb)
    return model.to(dtype).eval()


def tiny_rollouts(tokenizer, n_problems: int = 6, per_problem: int = 3, seed: int = 0,
                  min_len: int = 5, max_len: int = 40, text_rollouts: int = 1):
    """(rollouts DataFrame with the columns forcing.build_sequences reads, problems dict).

    Responses are random token ids (byte-level pieces, so characters split across tokens
    occur), every other one ending with EOS as a stopped generation would; the last
    ``text_rollouts`` rows are text-only (token_method "text", multi-byte characters)."""
    import pandas as pd

    from rlprobe_nb.suite import prompting

    gen = torch.Generator().manual_seed(seed)
    problems = {f"p{i:02d}": f"What is {i} + {2 * i}?" for i in range(n_problems)}
    first_real = max(int(i) for i in tokenizer.all_special_ids) + 1
    rows = []
    for i, (pid, problem) in enumerate(problems.items()):
        prompt = prompting.prompt_ids(tokenizer, problem)
        for j in range(per_problem):
            n = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
            resp = torch.randint(first_real, len(tokenizer), (n,), generator=gen).tolist()
            stopped = (i + j) % 2 == 0
            if stopped:
                resp.append(int(tokenizer.eos_token_id))
            rows.append({"rollout_id": f"{pid}#{j}", "problem_id": pid, "prompt_ids": prompt,
                         "response_ids": resp,
                         "response": tokenizer.decode(resp, skip_special_tokens=True),
                         "finish_reason": "stop" if stopped else "length",
                         "token_method": "generated"})
    texts = ["The answer is 42 \u00e9 \u65e5\u672c \U0001F642, so \\boxed{42}.",
             "Step 1: 7 \u00d7 6 = 42. \u2234 42"]
    for t in range(text_rollouts):
        rows[-1 - t].update(response=texts[t % len(texts)], response_ids=None,
                            token_method="text", finish_reason="imported")
    return pd.DataFrame(rows), problems

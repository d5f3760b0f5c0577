"""How a problem becomes a chat prompt: one definition shared by filtering, rollouts,
training of the demo suite and teacher forcing, so the forced prefix is exactly the one
the reference model was sampled from."""

from __future__ import annotations

DEFAULT_TEMPLATE = (
    "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}."
)


def user_message(problem: str, template: str = DEFAULT_TEMPLATE) -> str:
    # str.replace, not str.format: LaTeX braces in the problem must stay untouched.
    if "{problem}" not in template:
        raise ValueError(f"prompt template must contain '{{problem}}', got {template!r}")
    return template.replace("{problem}", problem)


def messages(problem: str, template: str = DEFAULT_TEMPLATE) -> list[dict[str, str]]:
    return [{"role": "user", "content": user_message(problem, template)}]


def prompt_ids(tokenizer, problem: str, template: str = DEFAULT_TEMPLATE) -> list[int]:
    """Token ids of the chat template with the generation prompt: the forced prefix.

    The template already carries BOS where the model wants one, so nothing else adds it.
    """
    ids = tokenizer.apply_chat_template(
        messages(problem, template), add_generation_prompt=True, tokenize=True
    )
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    ids = [int(i) for i in ids]
    bos = tokenizer.bos_token_id
    if bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        raise ValueError("chat template produced two BOS tokens; fix the tokenizer config")
    return ids


def text_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a response known only as text (imported from elsewhere): tokenized on
    its own, no special tokens added, and special-token *text* in it (a literal
    ``<|im_end|>`` written by a model or a person) encoded as ordinary text, never turned
    into the special token itself."""
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return [int(i) for i in ids]


def special_token_texts(tokenizer, text: str) -> list[str]:
    """The special-token strings that occur literally in ``text``."""
    return sorted({t for t in getattr(tokenizer, "all_special_tokens", []) if t and t in text})

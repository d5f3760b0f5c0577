"""Planted edits for the positive control of takeover curves.

Take a response the model got right and change one digit of its result into a wrong one.
Where the answer is copied from that result, the model's takeover curve over the edited
response must drop exactly where the wrong digit enters the prefix; the same edit placed
where the answer no longer depends on it (after the final box is closed) must leave the
curve without a drop. Only tokenizers that write each digit as its own token are
supported (Llama-3 and SmolLM2 do): the edit then swaps one token for one token.

Which digit is "the result": the last digit of the first occurrence of the gold answer as
a whole number in the response (not inside a longer number), i.e. where the working first
states the result (``28 + 33 = 61``) or, in one-line answers, the box itself
(``45 + 99 = \\boxed{144}``). ``in_box`` says which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlprobe_nb.forcing.spans import token_spans


@dataclass(frozen=True)
class Edit:
    pos: int  # the response token replaced
    old_id: int
    new_id: int
    where: str  # "result" | "after_answer"
    in_box: bool  # the edited digit sits inside a \boxed{...}


def digit_id(tokenizer, digit: str) -> int:
    ids = tokenizer.encode(digit, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"the tokenizer writes {digit!r} as {len(ids)} tokens; the digit edit "
                         "needs one token per digit")
    return int(ids[0])


def _box_ranges(text: str) -> list[tuple[int, int]]:
    """[start, end) of every closed \\boxed{...} / \\fbox{...}, braces matched."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            if text[j] == "\\":  # an escaped brace neither opens nor closes
                j += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:
            out.append((m.start(), j))
    return out


def _token_at(starts: list[int], ends: list[int], char: int) -> int:
    return next(i for i, (s, e) in enumerate(zip(starts, ends)) if s <= char < e)


def result_edit(tokenizer, response_ids, answer: str) -> Edit | None:
    """The edit of the result's last digit (d -> (d + 1) mod 10), or None where the
    response does not state the answer as a whole number or the digit is not a token."""
    pieces, starts, ends, text = token_spans(tokenizer, response_ids)
    m = re.search(r"(?<![\d.])" + re.escape(str(answer).strip()) + r"(?![\d])", text)
    if m is None or not str(answer).strip().lstrip("-").isdigit():
        return None
    last = m.end() - 1
    pos = _token_at(starts, ends, last)
    if pieces[pos] != text[last]:
        return None  # the digit shares its token with other characters
    new = str((int(text[last]) + 1) % 10)
    in_box = any(s <= last < e for s, e in _box_ranges(text))
    return Edit(pos, int(response_ids[pos]), digit_id(tokenizer, new), "result", in_box)


def after_answer_edit(tokenizer, response_ids, edit: Edit) -> Edit | None:
    """The same wrong digit put on the first token after the final box closes (the
    answer no longer depends on anything there), or None without a closed box."""
    pieces, starts, ends, text = token_spans(tokenizer, response_ids)
    boxes = _box_ranges(text)
    if not boxes:
        return None
    close = boxes[-1][1] - 1  # the closing brace
    pos = _token_at(starts, ends, close) + 1
    if pos >= len(response_ids):
        return None
    return Edit(pos, int(response_ids[pos]), edit.new_id, "after_answer", False)


def apply(response_ids, edit: Edit) -> list[int]:
    ids = [int(t) for t in response_ids]
    if ids[edit.pos] != edit.old_id:
        raise ValueError(f"token {edit.pos} is {ids[edit.pos]}, the edit expects {edit.old_id}")
    ids[edit.pos] = edit.new_id
    return ids

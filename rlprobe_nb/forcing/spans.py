"""Where each response token sits in the response text: its own text and its character
span in ``decode(ids, skip_special_tokens=True)``, so a chapter can highlight a token in
the text the reader sees."""

from __future__ import annotations

import os
from typing import Sequence


def token_spans(tokenizer, ids: Sequence[int]) -> tuple[list[str], list[int], list[int], str]:
    """Per token: its own text, and its [start, end) span in the response text
    decode(ids, skip_special_tokens=True).

    Incremental decoding over a short window (as serving engines stream text): a token
    that ends inside a multi-byte character gets an empty span and the token completing
    the character gets the whole character; special tokens get an empty span at the
    current end. Spans are monotone and tile the text. Tokenizers whose window decodes do
    not add up to the full decode fall back to exact (quadratic) prefix decoding.
    """
    ids = [int(i) for i in ids]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    special = set(int(i) for i in getattr(tokenizer, "all_special_ids", []))
    pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    starts, ends = [], []
    emitted_len, kept = 0, []
    prefix_off = read_off = 0
    last_real = -1
    for k, tid in enumerate(ids):
        if tid in special:
            starts.append(emitted_len)
            ends.append(emitted_len)
            continue
        kept.append(tid)
        last_real = k
        prefix_text = tokenizer.decode(kept[prefix_off:read_off], skip_special_tokens=True)
        new_text = tokenizer.decode(kept[prefix_off:], skip_special_tokens=True)
        delta = ""
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            prefix_off, read_off = read_off, len(kept)
        starts.append(emitted_len)
        emitted_len += len(delta)
        ends.append(emitted_len)
    if emitted_len < len(text) and last_real >= 0:
        # A response cut inside a character: its replacement char belongs to the last
        # real token; special tokens after it sit at the end.
        ends[last_real] = len(text)
        for k in range(last_real + 1, len(ids)):
            starts[k] = ends[k] = len(text)
        emitted_len = len(text)
    ok = emitted_len == len(text) and all(s <= e for s, e in zip(starts, ends))
    if ok:
        # The window deltas must reproduce the text exactly, not just its length.
        ok = "".join(text[s:e] for s, e in zip(starts, ends)) == text
    if not ok:
        starts, ends = _spans_by_prefix(tokenizer, ids, text)
    return pieces, starts, ends, text


def _spans_by_prefix(tokenizer, ids, text):
    starts, ends, end = [], [], 0
    for k in range(len(ids)):
        prefix = tokenizer.decode(ids[: k + 1], skip_special_tokens=True)
        common = len(os.path.commonprefix([prefix, text]))
        starts.append(end)
        end = max(end, common)
        ends.append(end)
    return starts, ends

"""The decode loop on a GPU (CUDA graphs, captured prompt prefill, the engine kept between
calls, the optional compiled step): a sequence's tokens depend on its own prompt, seed and
temperature and the number of slots only. Skipped without CUDA (run them on a GPU
machine: ``python -m pytest tests/test_decoding_cuda.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlprobe_nb.generation import decoding

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
REPO = Path(__file__).resolve().parents[1]

MODEL = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
model.config._attn_implementation = "sdpa"
"""


def _model():
    scope: dict = {}
    exec(MODEL, scope)  # noqa: S102 - the fixed snippet above, shared with the fresh processes
    return scope["model"]


def _requests(seed: int = 0, n: int = 12):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(5, 150, (1,), generator=g))  # several prompt buckets
        prompt = tuple(torch.randint(2, 1000, (length,), generator=g).tolist())
        out.append(decoding.Request(prompt, 1.0, 100 + i, 40))
    return out


@pytest.fixture(autouse=True)
def _fresh_engine():
    decoding.release()
    yield
    decoding.release()


def test_a_kept_engine_draws_what_a_fresh_one_draws():
    model, reqs = _model(), _requests()
    first = decoding.generate(model, reqs, [], slots=4)
    assert "engine" in decoding._HELD  # graphs captured and kept
    again = decoding.generate(model, reqs, [], slots=4)
    decoding.release()
    fresh = decoding.generate(model, reqs, [], slots=4)
    assert first == again == fresh


def test_a_sequence_does_not_depend_on_its_company():
    model = _model()
    reqs, others = _requests(0), _requests(1)
    mixed = [reqs[0], *others[:7], reqs[1]]
    a = decoding.generate(model, reqs[:2] + others[8:11], [], slots=4)
    b = decoding.generate(model, mixed, [], slots=4)
    assert a[0] == b[0] and a[1] == b[-1]


SCRIPT = MODEL + """
import json, sys
from rlprobe_nb.generation import decoding
sys.path.insert(0, "tests")
from test_decoding_cuda import _requests
print(json.dumps(decoding.generate(model, _requests(), [], slots=4,
                                   compiled=sys.argv[1] == "1")))
"""


@pytest.mark.parametrize("compiled", ["0", "1"])
def test_fresh_processes_draw_the_same_tokens(compiled):
    runs = [subprocess.run([sys.executable, "-c", SCRIPT, compiled], capture_output=True,
                           text=True, cwd=REPO, timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    a, b = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert a == b
    assert all(len(tokens) == 40 for tokens, _ in a)

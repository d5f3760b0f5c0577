"""The seeded sampler: a draw depends on (seed, step, logits) alone, not on the batch, the
process or the pruning; and its draws follow softmax(logits / T)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy import stats

from rlprobe_nb.generation import sampling

REPO = Path(__file__).resolve().parents[1]
SEEDS = [0, 1, 7, 2 ** 40 + 3, 2 ** 63 - 1, 123456789, 42, 99]
TEMPS = [1.0, 0.7, 0.0, 1.3, 0.6, 1.0, 0.9, 0.05]


def _logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * 3


def _draws(logits, seeds, step, temps, full: bool) -> list[int]:
    if full:  # every score, as on a GPU
        n = logits.shape[0]
        return sampling._keyed_full(
            logits, sampling.check_seeds(seeds), torch.full((n,), step),
            torch.tensor(temps, dtype=torch.float64),
            sampling.vocab_codes(logits.shape[1], logits.device)).tolist()
    return sampling.draw_rows(logits, seeds, step, temps).tolist()


@pytest.mark.parametrize("full", [False, True], ids=["pruned", "full"])
def test_batch_of_8_draws_what_batches_of_1_draw(full):
    logits = _logits(8, 49152)
    for step in (0, 5, 1000):
        together = _draws(logits, SEEDS, step, TEMPS, full)
        alone = [_draws(logits[i:i + 1], SEEDS[i:i + 1], step, TEMPS[i:i + 1], full)[0]
                 for i in range(8)]
        assert together == alone
        # the order of the rows in the batch does not matter either
        rev = _draws(logits.flip(0), SEEDS[::-1], step, TEMPS[::-1], full)
        assert rev[::-1] == together


def test_pruned_and_full_draw_the_same():
    logits = _logits(64, 4096, seed=1)
    seeds = list(range(1000, 1064))
    temps = [0.5 + (i % 8) / 8 for i in range(64)]
    for step in range(4):
        assert _draws(logits, seeds, step, temps, False) == _draws(logits, seeds, step, temps, True)


def test_the_uint32_hash_of_the_pruned_sampler_is_the_int64_one():
    """The CPU sampler finds the tokens whose noise may exceed CUT with a uint32 hash; it
    must pick exactly the tokens the int64 hash of ``draw_full`` gives those bits."""
    g = torch.Generator().manual_seed(3)
    seeds = torch.cat([torch.tensor([0, 2 ** 63 - 1, 2 ** 32 - 1, 2 ** 32]),
                       torch.randint(0, 2 ** 62, (60,), generator=g)])
    codes = sampling.vocab_codes(49152, "cpu")
    for step in (0, 1, 77, 2 ** 31 + 5):
        k1, k2 = sampling.row_keys(seeds, torch.full((64,), step))
        bits = sampling._bits(k1[:, None], k2[:, None], codes)
        want = bits >= sampling.BITS_AT_CUT
        assert 0 < int(want.sum()) < want.numel()
        assert torch.equal(sampling._lucky(k1, k2, 49152), want)
        # the whole hash, not only its threshold: the uint32 mixer equals the int64 one
        x = codes.numpy().astype("uint32")[None, :] ^ k1.numpy().astype("uint32")[:, None]
        sampling._mix32_u32(x, x.copy())
        x ^= k2.numpy().astype("uint32")[:, None]
        assert (x.astype("int64") == bits.numpy()).all()


SCRIPT = """
import json, torch
from rlprobe_nb.generation import sampling
g = torch.Generator().manual_seed(0)
logits = torch.randn(8, 49152, generator=g) * 3
seeds = json.loads('SEEDS'); temps = json.loads('TEMPS')
print(json.dumps([sampling.draw_rows(logits, seeds, k, temps).tolist() for k in range(3)]))
""".replace("SEEDS", json.dumps(SEEDS)).replace("TEMPS", json.dumps(TEMPS))


def test_two_fresh_processes_draw_the_same():
    outs = [json.loads(subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, check=True,
                                      capture_output=True, text=True).stdout)
            for _ in range(2)]
    here = [sampling.draw_rows(_logits(8, 49152), SEEDS, k, TEMPS).tolist() for k in range(3)]
    assert outs[0] == outs[1] == here


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
@pytest.mark.parametrize("full", [False, True], ids=["pruned", "full"])
def test_draws_follow_softmax_of_logits_over_t(temperature, full):
    """Chi-square over 6 tokens, 30,000 seeds at step 0 and 30,000 at step 9."""
    logits = torch.tensor([1.5, 0.0, -1.0, 0.7, 2.2, -3.0])
    n = 30_000
    counts = torch.zeros(6)
    for step in (0, 9):
        seeds = list(range(step * n, step * n + n))
        drawn = _draws(logits.expand(n, -1).contiguous(), seeds, step, [temperature] * n, full)
        counts += torch.bincount(torch.tensor(drawn), minlength=6)
    expected = torch.softmax(logits.double() / temperature, 0) * counts.sum()
    p = stats.chisquare(counts.numpy(), expected.numpy()).pvalue
    assert p > 1e-4, (counts.tolist(), expected.tolist(), p)


def test_greedy_is_argmax_first_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    assert sampling.draw_rows(logits, [5], 0, [0.0]).tolist() == [1]

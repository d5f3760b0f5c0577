"""The fused Triton reductions (CUDA's metric path) against float64 and the torch path.

Triton's interpreter runs the kernel on the CPU; it must be switched on before the kernel
module is imported, so the checks run in a fresh interpreter process and report back as
JSON. The GPU build (libdevice transcendentals) is checked the same way against float64
in benchmarks/bench_engine.py on the card itself.
"""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHECKS = textwrap.dedent('''
    import json, math, torch
    from rlprobe_nb.forcing import fused_metrics, metrics
    from rlprobe_nb.forcing.metrics import reference_metrics_f64, relative_error, token_metrics
    assert fused_metrics.INTERPRETED
    FLOOR = {"kl_ckpt_ref": 0.03, "kl_ref_ckpt": 0.03, "js": 0.03}
    ROW = metrics.FLOAT_METRICS + metrics.INT_METRICS
    fused = metrics.fused_row_fn
    small_blocks = lambda *a: metrics.fused_row_fn(*a, block=512)
    out = {}

    def pair(n, v, scale, noise, seed):
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(n, v, generator=g) * scale
        return a, a + torch.randn(n, v, generator=g) * noise, torch.randint(0, v, (n,), generator=g)

    for scale, noise in [(1.0, 0.3), (3.0, 0.5), (20.0, 1.0), (3.0, 0.05)]:
        a, b, t = pair(24, 3000, scale, noise, 1)   # 3000 = 5 blocks of 512 + a tail of 440
        want = reference_metrics_f64(torch.log_softmax(a.double(), -1),
                                     torch.log_softmax(b.double(), -1), t, a.double(), b.double())
        got = token_metrics(a, b, t, topk=3, row_fn=small_blocks)
        eager = token_metrics(a, b, t, topk=3)
        out[f"f64 {scale}/{noise}"] = {m: relative_error(got[m], want[m], FLOOR.get(m, 1e-12)).max().item()
                                      for m in ROW}
        out[f"eager {scale}/{noise}"] = {m: (got[m].double() - eager[m].double()).abs().max().item()
                                        for m in ROW + metrics.TOPK_METRICS}
        out[f"median kl {scale}/{noise}"] = want["kl_ckpt_ref"].median().item()

    a, b, t = pair(8, 1000, 3.0, 0.5, 2)
    same = token_metrics(a, a.clone(), t, topk=0, row_fn=fused)
    out["self"] = [same[m].abs().max().item() for m in ("kl_ckpt_ref", "kl_ref_ckpt", "js")]
    fwd = token_metrics(a, b, t, topk=0, row_fn=fused)
    rev = token_metrics(b, a, t, topk=0, row_fn=fused)
    out["swap"] = [torch.equal(fwd["kl_ckpt_ref"], rev["kl_ref_ckpt"]),
                   torch.equal(fwd["kl_ref_ckpt"], rev["kl_ckpt_ref"]),
                   torch.equal(fwd["js"], rev["js"])]
    # disjoint peaks: d of +-80 and beyond in both JS branches, KL large, JS near ln 2
    x = torch.full((2, 700), -60.0); y = torch.full((2, 700), -60.0)
    x[:, 3] = 40.0; y[:, 5] = 40.0
    ext = token_metrics(x, y, torch.tensor([3, 5]), topk=0, row_fn=fused)
    want = reference_metrics_f64(torch.log_softmax(x.double(), -1), torch.log_softmax(y.double(), -1),
                                 torch.tensor([3, 5]), x.double(), y.double())
    out["extreme"] = {m: relative_error(ext[m], want[m], 1e-12).max().item()
                      for m in ("kl_ckpt_ref", "kl_ref_ckpt", "js", "logp_ckpt", "logp_ref")}
    out["extreme js vs ln2"] = (math.log(2) - ext["js"].double()).abs().max().item()
    # ties: rank counts strictly larger logits only
    z = torch.tensor([[1.0, 3.0, 3.0, 0.5, 2.0]] * 5)
    r = token_metrics(z, z, torch.tensor([1, 2, 4, 0, 3]), topk=0, row_fn=fused)
    out["ranks"] = r["rank_ckpt"].tolist()
    # logits masked to -inf in both models (e.g. a vocabulary mask): the same values as the
    # distributions over the unmasked entries alone, finite, no NaN
    a, b, t = pair(6, 900, 3.0, 0.5, 3)
    keep = torch.ones(900, dtype=torch.bool); keep[::7] = False; keep[t] = True
    am, bm = a.masked_fill(~keep, float("-inf")), b.masked_fill(~keep, float("-inf"))
    t_kept = (torch.cumsum(keep.long(), 0) - 1)[t]
    want = reference_metrics_f64(torch.log_softmax(a[:, keep].double(), -1),
                                 torch.log_softmax(b[:, keep].double(), -1), t_kept,
                                 a[:, keep].double(), b[:, keep].double())
    for label, fn in (("fused", fused), ("eager", None)):
        got = token_metrics(am, bm, t, topk=3, row_fn=fn)
        out[f"masked {label}"] = {m: relative_error(got[m], want[m], 1e-12).max().item()
                                  for m in ROW}
    # masked in one model only: KL(ckpt||ref) stays finite, KL(ref||ckpt) is infinite
    one = token_metrics(am, b, t, topk=0, row_fn=fused)
    out["one-sided"] = [bool(torch.isfinite(one["kl_ckpt_ref"]).all()),
                        bool(torch.isinf(one["kl_ref_ckpt"]).all()),
                        bool(torch.isfinite(one["js"]).all())]
    # the engine's own check before it trusts the kernel on a device (all outputs, top-k too)
    out["self_check"] = metrics._fused_ok(torch.device("cpu"))
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def results():
    assert importlib.util.find_spec("triton"), "triton missing: pip install -e '.[test]'"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", CHECKS], cwd=root, env=env, text=True,
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["1.0/0.3", "3.0/0.5", "20.0/1.0"])
def test_fused_matches_float64_within_1e5_relative(results, case):
    errors = results[f"f64 {case}"]
    assert max(errors.values()) < 1e-5, errors
    assert results[f"median kl {case}"] > 1e-3  # the divergences are not negligible


def test_fused_js_near_identical_distributions(results):
    # |d| < 1 almost everywhere: the polynomial branch of the JS term carries the sum
    errors = results["f64 3.0/0.05"]
    assert max(errors.values()) < 1e-5, errors  # 1e-5 relative, 3e-7 absolute below 0.03


@pytest.mark.parametrize("case", ["1.0/0.3", "3.0/0.5", "20.0/1.0", "3.0/0.05"])
def test_fused_agrees_with_the_torch_path(results, case):
    diffs = results[f"eager {case}"]
    # same formulas in fp32 with float64 sums: differences are rounding-level only
    assert max(v for k, v in diffs.items() if not k.startswith(("rank", "topk_ids"))) < 1e-5, diffs
    assert all(diffs[k] == 0 for k in ("rank_ckpt", "rank_ref", "topk_ids_ckpt", "topk_ids_ref"))


def test_fused_exact_zeros_swap_ties_and_extremes(results):
    assert results["self"] == [0.0, 0.0, 0.0]
    assert results["swap"] == [True, True, True]
    assert max(results["extreme"].values()) < 1e-5, results["extreme"]
    assert results["extreme js vs ln2"] < 1e-6
    assert results["ranks"] == [1, 1, 3, 4, 5]
    assert results["self_check"] is True


@pytest.mark.parametrize("path", ["fused", "eager"])
def test_logits_masked_in_both_models_count_as_absent(results, path):
    """-inf at the same entries of both models: exact values of the unmasked distributions
    (the old math gave NaN from 0 * (-inf - -inf))."""
    errors = results[f"masked {path}"]
    assert max(errors.values()) < 1e-5, errors


def test_logits_masked_in_one_model_give_an_infinite_kl_in_one_direction(results):
    assert results["one-sided"] == [True, True, True]

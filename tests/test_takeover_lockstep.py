"""Takeover decoding (rlprobe_nb.takeover) on two tiny random Llama models: exactness.

The reference is a random model and the checkpoint a copy of it with N(0, 0.01) noise on
every weight: KL(ref||ckpt) is ~0.3 nats a position and the two draws differ at about a
third of the positions, so takeovers change some tokens and leave most, and the rules'
texts share prefixes (thresholds near the scores' medians). Every decision the
decoder makes is captured through ``record`` (the node's prefix, both draws, every score)
and the tests hold the written texts to those decisions, to each model's own sampler, to
the token tables' metrics of the final texts and to a float64 computation.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from rlprobe_nb.demo.tiny import tiny_llama, tiny_tokenizer
from rlprobe_nb.forcing import metrics
from rlprobe_nb.forcing.precision import BATCH_TOLERANCE
from rlprobe_nb.generation import decoding, sampling
from rlprobe_nb.suite import prompting
from rlprobe_nb.takeover import criteria, lockstep
from rlprobe_nb.takeover.lockstep import ALWAYS, NEVER, Request, Rule, takeover_generate

PROBLEMS = ["What is 7 times 6?", "What is 12 + 30?", "Compute 3 + 4.", "What is 9 - 2?"]
SEEDS = [101, 102, 103, 104, 105]  # the last request shares the first one's prompt
MAX_NEW = 24
TEMPERATURE = 1.0
RULES = (NEVER, ALWAYS,
         Rule("delta_logp", 0.3), Rule("delta_logp", 1.0), Rule("delta_logp", 1e9),
         Rule("kl", 0.1), Rule("kl", 0.4), Rule("entropy", 3.0), Rule("entropy", 3.8),
         Rule("random", 0.8), Rule("random", -1.0))
NEVER_LIKE = [RULES.index(NEVER), RULES.index(Rule("delta_logp", 1e9))]
ALWAYS_LIKE = [RULES.index(ALWAYS), RULES.index(Rule("random", -1.0))]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: these models are too small to gain from two, and two threads on
    two busy cores spin (measured on the 2-core machine under load: 18 s for this file at
    two threads, 2.5 s at one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def world():
    tok = tiny_tokenizer()
    ref = tiny_llama(len(tok), seed=0)
    ckpt = tiny_llama(len(tok), seed=1, base=ref, perturb=0.01)
    prompts = [tuple(prompting.prompt_ids(tok, p)) for p in PROBLEMS]
    prompts.append(prompts[0])
    return SimpleNamespace(tok=tok, ref=ref, ckpt=ckpt, prompts=prompts,
                           eos=[int(tok.eos_token_id)])


def _requests(w, rules=RULES, seeds=SEEDS):
    return [Request(p, s, tuple(rules)) for p, s in zip(w.prompts, seeds)]


def _takeover(w, requests, temperature=TEMPERATURE, **kw):
    return takeover_generate(w.ref, w.ckpt, requests, w.eos, temperature=temperature,
                             max_new_tokens=MAX_NEW, **kw)


@pytest.fixture(scope="module")
def run(world):
    """One run of every rule on every request, with every decision recorded: a dict
    (request, prefix) -> that node's draws, rules and scores (a prefix decided twice is
    kept in ``twice``: it must not happen, a node being one distinct prefix)."""
    decisions, twice = {}, []

    def record(nodes, x_ref, x_ckpt, scores):
        for b, node in enumerate(nodes):  # nodes change after the call: copy what we need
            key = (node.request, tuple(node.ids))
            if key in decisions:
                twice.append(key)
            decisions[key] = SimpleNamespace(
                x_ref=int(x_ref[b]), x_ckpt=int(x_ckpt[b]), rules=tuple(node.rules),
                scores={name: float(v[b]) for name, v in scores.items()})

    stats = {}
    written = _takeover(world, _requests(world), batch=64, record=record, stats=stats)
    return SimpleNamespace(written=written, decisions=decisions, twice=twice, stats=stats)


def _passes(rule, scores):
    if rule.criterion in ("never", "always"):
        return rule.criterion == "always"
    return scores[rule.criterion] > rule.threshold


# 1. the two ends ---------------------------------------------------------------------

def _alone(w, model, temperature, finish=None):
    reqs = [decoding.Request(p, temperature, s, MAX_NEW) for p, s in zip(w.prompts, SEEDS)]
    return decoding.generate(model, reqs, w.eos, finish=finish)


def _check_ends(w, written, temperature, finish=None):
    ref_alone = _alone(w, w.ref, temperature, finish)
    ckpt_alone = _alone(w, w.ckpt, temperature, finish)
    for i, per in enumerate(written):
        for r in NEVER_LIKE:
            assert (per[r].ids, per[r].finish) == tuple(ref_alone[i]), (i, RULES[r])
            assert per[r].taken == per[r].changed == []
        for r in ALWAYS_LIKE:
            assert (per[r].ids, per[r].finish) == tuple(ckpt_alone[i]), (i, RULES[r])
            assert per[r].taken == list(range(len(per[r].ids)))
    # not vacuous: the two models write different texts from the same seeds
    assert sum(a[0] != b[0] for a, b in zip(ref_alone, ckpt_alone)) >= len(SEEDS) - 1


def test_never_and_always_reproduce_each_model_alone(world, run):
    """A rule that never passes writes the reference's own sampled text, token for token
    (same seeds, the book's generator); one that always passes, the checkpoint's."""
    _check_ends(world, run.written, TEMPERATURE)


def _ends_on_multiple_of_17(ids):
    return "seventeen" if ids[-1] % 17 == 0 else None


@pytest.mark.parametrize("temperature, finish", [(0.0, None), (0.6, _ends_on_multiple_of_17)])
def test_ends_at_other_temperatures(world, temperature, finish):
    """The same at other temperatures (0: greedy), and with a ``finish`` that ends texts
    at tokens of their own (both generators call it the same way)."""
    rules = [RULES[r] for r in NEVER_LIKE + ALWAYS_LIKE]
    written = _takeover(world, _requests(world, rules), temperature, finish=finish)
    full = [[None] * len(RULES) for _ in written]  # back to RULES' indices
    for per, out in zip(written, full):
        for r, w in zip(NEVER_LIKE + ALWAYS_LIKE, per):
            out[r] = w
    _check_ends(world, full, temperature, finish)
    if finish is not None:  # not vacuous: some text ended by it
        assert any(w.finish == "seventeen" for per in written for w in per)


# 2. what each rule wrote, and what a takeover leaves alone ----------------------------

def test_every_token_is_the_rules_decision(run):
    """At each position of each rule's text the token is the checkpoint's draw where the
    rule's criterion passed on the score the decoder saw, else the reference's draw;
    ``taken`` lists the first, ``changed`` those where the two draws differ."""
    assert run.twice == []
    for i, per in enumerate(run.written):
        for r, (rule, w) in enumerate(zip(RULES, per)):
            taken, changed = [], []
            for p, token in enumerate(w.ids):
                d = run.decisions[(i, tuple(w.ids[:p]))]
                assert r in d.rules
                if _passes(rule, d.scores):
                    taken.append(p)
                    changed += [p] if d.x_ckpt != d.x_ref else []
                assert token == (d.x_ckpt if p in taken else d.x_ref), (i, rule, p)
            assert (w.taken, w.changed) == (taken, changed), (i, rule)


def _first_change(w) -> float:
    return w.changed[0] if w.changed else math.inf


def test_takeover_at_k_leaves_earlier_positions_unchanged(run):
    """Before a rule's first changed position k its text is the reference's own (the
    never rule's); at k its token is the checkpoint's draw, which the reference's differs
    from. A rule that changed nothing wrote exactly the reference's text."""
    changes = 0
    for i, per in enumerate(run.written):
        never = per[RULES.index(NEVER)]
        for rule, w in zip(RULES, per):
            if not w.changed:
                assert (w.ids, w.finish) == (never.ids, never.finish), (i, rule)
                continue
            k = w.changed[0]
            changes += 1
            assert w.ids[:k] == never.ids[:k], (i, rule)
            d = run.decisions[(i, tuple(w.ids[:k]))]
            assert w.ids[k] == d.x_ckpt != d.x_ref == never.ids[k], (i, rule)
    assert changes >= len(SEEDS) * 4  # not vacuous


def test_higher_threshold_diverges_no_earlier(run):
    """Rules of one criterion see the same scores while their texts are the reference's,
    so a higher threshold passes on a subset of the positions there and changes its first
    token no earlier (``always`` earliest of all). After texts diverge no order holds."""
    for i, per in enumerate(run.written):
        always = _first_change(per[RULES.index(ALWAYS)])
        assert all(always <= _first_change(w) for w in per)
        for crit in criteria.CRITERIA:
            ranked = sorted((rule.threshold, w) for rule, w in zip(RULES, per)
                            if rule.criterion == crit)
            for (_, low), (_, high) in zip(ranked, ranked[1:]):
                k = _first_change(low)
                assert k <= _first_change(high), (i, crit)
                assert {p for p in high.taken if p <= k} <= set(low.taken), (i, crit)


# 3. the criteria are the token tables' metrics ----------------------------------------

def _forced(w, prompt, ids):
    """Both models' logits [len(ids), V] predicting each of ``ids`` after ``prompt``,
    from one full forward of each (teacher forcing): (reference, checkpoint)."""
    full = torch.tensor([list(prompt) + list(ids)])
    rows = slice(len(prompt) - 1, len(prompt) - 1 + len(ids))
    with torch.no_grad():
        return w.ref(full).logits[0, rows].float(), w.ckpt(full).logits[0, rows].float()


def _texts(run):
    return sorted({(i, tuple(w.ids)) for i, per in enumerate(run.written) for w in per})


def test_draws_are_each_models_seeded_draw(world, run):
    """Both draws the decoder recorded at each position of each distinct text are the
    Gumbel-max of that model's teacher-forced logits under the request's seed and the
    position: the recorded token's score is the row's top score, up to the float32
    rounding that separates one-token steps from a full forward (1e-4: about 5x the
    largest difference between the two ways' criteria below, 2.2e-5 measured), and is
    the argmax itself at all but near ties (measured: every one of 1,684). So the token at
    a takeover is the checkpoint's draw over the same prefix, computed without the
    decoder."""
    exact = compared = 0
    for i, ids in _texts(run):
        n = len(ids)
        k1, k2 = sampling.row_keys(torch.full((n,), SEEDS[i]), torch.arange(n))
        noise = sampling.noise(k1[:, None], k2[:, None], torch.arange(len(world.tok))[None])
        for logits, side in zip(_forced(world, world.prompts[i], ids), ("x_ref", "x_ckpt")):
            z = logits.double() / TEMPERATURE + noise
            for p in range(n):
                x = getattr(run.decisions[(i, ids[:p])], side)
                assert float(z[p, x]) >= float(z[p].max()) - 1e-4, (i, p, side)
                exact += x == int(z[p].argmax())
                compared += 1
    assert exact >= compared - 2, (exact, compared)  # near ties are rare
    print(f"draws: {exact} of {compared} the teacher-forced argmax")


def test_criteria_equal_token_table_metrics(world, run):
    """delta_logp = logp_ref - logp_ckpt of the written token (where it is the
    reference's draw), kl = kl_ref_ckpt and entropy = entropy_ref at every position of
    every distinct text, teacher-forced. The decoder's logits come from one-token steps of
    a batch over its key/value buffers, the tables' from one forward of the whole text:
    the same math rounded differently in float32, which is what BATCH_TOLERANCE bounds
    (the tables' own change with batch shape, measured on the demo models)."""
    worst, compared = 0.0, 0
    for i, ids in _texts(run):
        logits_q, logits_p = _forced(world, world.prompts[i], ids)
        m = metrics.token_metrics(logits_p, logits_q, torch.tensor(ids), topk=0)
        for p in range(len(ids)):
            d = run.decisions[(i, ids[:p])]
            want = {"kl": float(m["kl_ref_ckpt"][p]), "entropy": float(m["entropy_ref"][p])}
            if ids[p] == d.x_ref:
                want["delta_logp"] = float(m["logp_ref"][p] - m["logp_ckpt"][p])
            for name, value in want.items():
                err = abs(d.scores[name] - value) / max(1.0, abs(value))
                assert err <= BATCH_TOLERANCE, (i, p, name, d.scores[name], value)
                worst, compared = max(worst, err), compared + 1
    assert compared > 500
    print(f"criteria vs token tables: {compared} values, worst {worst:.2e}")


def _direct(ref_row, ckpt_row, x):
    """delta_logp, KL(ref||ckpt), H(ref) of one row in float64, term by term (math.fsum)."""
    def log_softmax(row):
        top = max(row)
        lse = top + math.log(math.fsum(math.exp(v - top) for v in row))
        return [v - lse for v in row]
    lq, lp = log_softmax(ref_row), log_softmax(ckpt_row)
    q = [math.exp(v) for v in lq]
    kl = math.fsum(qi * (a - b) for qi, a, b in zip(q, lq, lp) if qi > 0)
    entropy = -math.fsum(qi * a for qi, a in zip(q, lq) if qi > 0)
    return lq[x] - lp[x], kl, entropy


def test_scores_match_float64_on_random_logits():
    """criteria.scores against a term-by-term float64 computation, on fp32 logits of
    ordinary spread and on rows so peaked that most probabilities underflow to 0 (their
    terms must be 0, not 0 * inf = nan)."""
    gen = torch.Generator().manual_seed(5)
    rows, vocab = 12, 97
    scale = torch.tensor([3.0] * 8 + [400.0] * 4)[:, None]  # 400: gaps of ~1000 nats
    ref_logits = (torch.randn(rows, vocab, generator=gen) * scale).float()
    ckpt_logits = (ref_logits + torch.randn(rows, vocab, generator=gen)).float()
    x = torch.randint(0, vocab, (rows,), generator=gen)
    x[8:] = ref_logits[8:].argmax(-1)  # the peaked rows' draw: a token they can write
    seeds, steps = torch.arange(rows) + 7, torch.arange(rows)
    got = criteria.scores(ref_logits, ckpt_logits, x, seeds, steps)
    assert all(v.dtype == torch.float64 and bool(v.isfinite().all()) for v in got.values())
    for b in range(rows):
        want = _direct(ref_logits[b].double().tolist(), ckpt_logits[b].double().tolist(),
                       int(x[b]))
        for name, value in zip(("delta_logp", "kl", "entropy"), want):
            assert abs(float(got[name][b]) - value) <= 1e-12 * max(1.0, abs(value)), (b, name)
    assert torch.equal(got["random"], criteria.coin(seeds, steps))


# 4. the random criterion -------------------------------------------------------------

def _grid(n_seeds=200, n_steps=250):
    seeds = torch.arange(n_seeds).repeat_interleave(n_steps) * 7919 + 13
    steps = torch.arange(n_steps).repeat(n_seeds)
    return seeds, steps


def _within(share: float, rate: float, n: int, sigmas: float = 5.0) -> bool:
    """A binomial bound: |share - rate| within ``sigmas`` standard deviations."""
    return abs(share - rate) <= sigmas * math.sqrt(rate * (1 - rate) / n)


@pytest.mark.parametrize("rate", [0.02, 0.1, 0.3, 0.5])
def test_random_criterion_passes_at_its_rate(rate):
    seeds, steps = _grid()
    u = criteria.coin(seeds, steps)
    assert bool(((u > 0) & (u < 1)).all())
    share = float((u > 1 - rate).double().mean())
    assert _within(share, rate, len(u)), (share, rate)


def test_random_criterion_is_not_the_sampling_noise():
    """The coin at (seed, step) is drawn from another stream than the Gumbel noise of the
    same (seed, step): uncorrelated with it, and joint passes at the product rate."""
    seeds, steps = _grid()
    n = len(seeds)
    u = criteria.coin(seeds, steps)
    k1, k2 = sampling.row_keys(seeds, steps)
    unsalted = (k1.double() + 0.5) / 2.0 ** 32  # the coin had it used the noise's keys
    assert float((u == unsalted).double().mean()) < 1e-3
    for token in (0, 1, 57):  # the noise of a token, through the Gumbel CDF: uniform
        g = sampling.noise(k1, k2, torch.full((n,), token)).double()
        v = torch.exp(-torch.exp(-g))
        corr = float(torch.corrcoef(torch.stack([u, v]))[0, 1])
        assert abs(corr) <= 5 / math.sqrt(n), (token, corr)
        both = float(((u > 0.8) & (v > 0.8)).double().mean())
        assert _within(both, 0.04, n), (token, both)


def test_random_rule_takes_the_coin_of_seed_and_position(run):
    """In the decoder a random rule passes at position p exactly where the coin of (the
    request's seed, p) is above its threshold, whatever the models wrote."""
    r = RULES.index(Rule("random", 0.8))
    for i, per in enumerate(run.written):
        n = len(per[r].ids)
        u = criteria.coin(torch.full((n,), SEEDS[i]), torch.arange(n))
        assert per[r].taken == [p for p in range(n) if u[p] > 0.8], i


# 5. splitting and batching ------------------------------------------------------------

def _as_tuples(written):
    return [[(w.ids, w.finish, w.taken, w.changed) for w in per] for per in written]


def test_results_do_not_depend_on_the_batch(world, run, monkeypatch):
    """Each request alone, two nodes at a time (requests wait, buffers grow and shrink)
    and all together write the same texts, taken and changed positions."""
    reqs = _requests(world)
    alone = [_takeover(world, [req])[0] for req in reqs]
    calls = {"grow": 0, "compact": 0}
    for name in calls:
        method = getattr(lockstep._Pair, name)

        def counted(self, *args, _method=method, _name=name):
            calls[_name] += 1
            return _method(self, *args)
        monkeypatch.setattr(lockstep._Pair, name, counted)
    two = _takeover(world, reqs, batch=2)
    assert calls["grow"] > 0 and calls["compact"] > 0, calls
    assert _as_tuples(alone) == _as_tuples(run.written)
    assert _as_tuples(two) == _as_tuples(run.written)


def test_a_memory_cap_admits_fewer_and_writes_the_same(world, run, monkeypatch):
    """Where the device's memory holds few slots (``slot_limit``, CUDA only: forced here),
    requests are admitted while the live nodes fill half of them, the buffers grow past
    the cap only by the one slot a split needs, and the texts are the same."""
    monkeypatch.setattr(lockstep, "slot_limit", lambda ref, ckpt, length, reserve: 6)
    growths = []
    grow = lockstep._Pair.grow

    def tracked(self, extra):
        before = self.slots
        grow(self, extra)
        growths.append((before, self.slots))
    monkeypatch.setattr(lockstep._Pair, "grow", tracked)
    live = []
    stats = {}
    written = _takeover(world, _requests(world), batch=64, stats=stats,
                        record=lambda nodes, *_: live.append(len(nodes)))
    assert _as_tuples(written) == _as_tuples(run.written)
    assert stats["slot_limit"] == 6 and growths
    assert all(after - before == 1 for before, after in growths if after > 6), growths
    assert max(live) > 3  # splits went past the admission cap (3), as they may


def test_out_of_memory_halves_the_batch_and_keeps_what_finished(world, run, monkeypatch):
    """An out-of-memory error mid-run: a warning, the unfinished requests decoded again
    with half the nodes at a time, the same texts, and the progress counts each rule's
    text once."""
    step, calls = lockstep._Pair.step, {"n": 0}

    def failing_once(self, tokens, pos):
        calls["n"] += 1
        if calls["n"] == 20:  # after some rules' texts ended (EOS), before the rest
            raise RuntimeError("CUDA error: out of memory")
        return step(self, tokens, pos)
    monkeypatch.setattr(lockstep._Pair, "step", failing_once)
    done = []
    with pytest.warns(UserWarning, match="out of GPU memory in takeover decoding at 64 "
                                         "nodes at a time: the unfinished requests again at 32"):
        written = _takeover(world, _requests(world), batch=64, progress=done.append)
    assert calls["n"] > 20
    assert _as_tuples(written) == _as_tuples(run.written)
    assert sum(done) == len(SEEDS) * len(RULES) and min(done) < 0  # partial texts taken back


def test_cost_is_the_distinct_prefixes(run):
    """node_steps (rows forwarded after the prompts) is the number of distinct proper
    prefixes of the texts written (one node per prefix): at most the distinct texts'
    lengths summed, and less than one run per rule."""
    texts = {(i, tuple(w.ids)) for i, per in enumerate(run.written) for w in per}
    prefixes = {(i, ids[:k]) for i, ids in texts for k in range(1, len(ids))}
    per_rule = sum(len(w.ids) - 1 for per in run.written for w in per)
    assert run.stats["node_steps"] == len(prefixes)
    assert run.stats["node_steps"] <= sum(len(ids) for _, ids in texts)
    assert run.stats["node_steps"] < per_rule / 2  # texts share most of their prefixes
    print(f"{len(texts)} distinct texts, {run.stats['node_steps']} node steps, "
          f"{per_rule} for one run per rule")


def test_prompts_are_prefilled_once_per_model_and_kept_for_the_next_run(world, run):
    """A prompt is prefilled once per model (the fifth request shares the first one's
    prompt: one hit in each model), and the reference's prompts kept from one run serve
    the next: the texts are the same, token for token, as those written without."""
    assert run.stats["prompt_hits"] == 2
    kept = lockstep.PromptCache(world.ref)
    first, second = {}, {}
    _takeover(world, _requests(world), batch=64, ref_prompts=kept, stats=first)
    again = _takeover(world, _requests(world), batch=64, ref_prompts=kept, stats=second)
    assert first["prompt_hits"] == 2 and second["prompt_hits"] == 1 + len(SEEDS)
    assert [[(w.ids, w.finish, w.taken, w.changed) for w in per] for per in again] == \
        [[(w.ids, w.finish, w.taken, w.changed) for w in per] for per in run.written]
    with pytest.raises(ValueError, match="another model's prompts"):
        _takeover(world, _requests(world)[:1], ref_prompts=lockstep.PromptCache(world.ckpt))
    small = lockstep.PromptCache(world.ref, max_bytes=1)
    _takeover(world, _requests(world)[:2], ref_prompts=small)
    assert small.entries == {} and small.bytes == 0, "nothing kept beyond its bytes"


# 6. bad input -----------------------------------------------------------------------

@pytest.mark.parametrize("change, match", [
    (dict(rules=(Rule("delta-logp", 1.0),)), "unknown takeover criterion 'delta-logp'"),
    (dict(prompt=()), "request 1 has an empty prompt"),
    (dict(rules=()), "request 1 has no rules"),
    (dict(temperature=-0.5), "temperature >= 0.*-0.5"),
    (dict(max_new_tokens=0), "max_new_tokens >= 1.*0"),
])
def test_bad_input_raises(world, change, match):
    kw = dict(temperature=1.0, max_new_tokens=4)
    reqs = _requests(world, RULES[:2])[:2]
    if "prompt" in change or "rules" in change:
        reqs[1] = Request(change.get("prompt", reqs[1].prompt), reqs[1].seed,
                          change.get("rules", reqs[1].rules))
    kw.update({k: v for k, v in change.items() if k in kw})
    with pytest.raises(ValueError, match=match):
        takeover_generate(world.ref, world.ckpt, reqs, world.eos, **kw)

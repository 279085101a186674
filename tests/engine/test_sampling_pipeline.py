"""End to end through the real pieces: a tiny random target, a tiny random draft model
sampling with temperature, top-k and top-p, full rounds with cache rollback. The first two
emitted tokens must follow the target's own (processed) distribution exactly."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from engine.drafters.base import Proposal
from engine.drafters.model_drafter import ModelDrafter
from engine.sampling import Sampler
from engine.verifying.exact import exact_verifier
from tests.engine.tiny_models import cached, run_round, tiny_llama

VOCAB = 8
PROMPT = [1, 5, 2]
SAMPLES = 2000


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models spend their time in per-op overhead; a second thread only adds sync cost.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class LyingDrafter(ModelDrafter):
    """A plausible bug: the draft reports distributions other than those it sampled from."""

    def propose(self, context, room, sampler):
        proposal = super().propose(context, room, sampler)
        return Proposal(proposal.tree, torch.full_like(proposal.draft_probs, 1 / VOCAB), proposal.draft_calls)


def exact_two_token_distribution(target_model, sampler: Sampler) -> dict[tuple[int, int], float]:
    with torch.inference_mode():
        first = sampler.probabilities(target_model(torch.tensor([PROMPT])).logits[0, -1:])[0]
        second = sampler.probabilities(
            target_model(torch.tensor([PROMPT + [x] for x in range(VOCAB)])).logits[:, -1]
        )  # (V, V): row x is p(. | prompt, x)
    return {(a, b): float(first[a] * second[a, b]) for a in range(VOCAB) for b in range(VOCAB)}


def chi_square(counts: Counter, expected: dict, samples: int) -> tuple[float, int]:
    statistic, bins, pooled_expected, pooled_observed = 0.0, 0, 0.0, 0
    for cell, probability in expected.items():
        if probability * samples < 5:
            pooled_expected += probability * samples
            pooled_observed += counts[cell]
            continue
        statistic += (counts[cell] - probability * samples) ** 2 / (probability * samples)
        bins += 1
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        bins += 1
    return statistic, bins - 1


def critical_value(df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square 0.999 quantile."""
    return df * (1 - 2 / (9 * df) + 3.0902 * math.sqrt(2 / (9 * df))) ** 3


def first_two_tokens(drafter_class, verifier: str, seed: int) -> tuple[Counter, dict]:
    target_model = tiny_llama(seed=1, vocab_size=VOCAB)
    draft_model = tiny_llama(seed=2, vocab_size=VOCAB)
    sampler = Sampler(temperature=1.3, top_k=6, top_p=0.9, generator=torch.Generator().manual_seed(seed))
    target, drafter = cached(target_model), drafter_class(cached(draft_model), VOCAB, 2)
    counts: Counter = Counter()
    for _ in range(SAMPLES):
        context = list(PROMPT)
        while len(context) < len(PROMPT) + 2:
            context += run_round(target, drafter, context, sampler, exact_verifier(verifier)).tokens
        counts[tuple(context[len(PROMPT) : len(PROMPT) + 2])] += 1
    return counts, exact_two_token_distribution(target_model, sampler)


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_sampled_chain_follows_the_target_distribution(verifier):
    counts, expected = first_two_tokens(ModelDrafter, verifier, seed=5)
    statistic, df = chi_square(counts, expected, SAMPLES)
    assert statistic <= critical_value(df), f"chi-square {statistic:.1f} on {df} df"


def test_a_draft_that_misreports_its_distribution_is_caught():
    counts, expected = first_two_tokens(LyingDrafter, "block", seed=5)
    statistic, df = chi_square(counts, expected, SAMPLES)
    assert statistic > critical_value(df), f"a lying draft passed: chi-square {statistic:.1f} on {df} df"


def test_the_greedy_token_is_torch_argmax_on_ties_nans_and_views():
    from engine.sampling import best_token, best_tokens

    generator = torch.Generator().manual_seed(5)
    rows = torch.randint(-3, 4, (64, 300), generator=generator).float()  # many ties per row
    rows[3, 17] = float("nan")  # counted the largest, as torch.argmax counts it
    rows[5, :] = float("-inf")
    for logits in (rows, rows[:, ::2], rows.t().contiguous().t(), rows.to(torch.bfloat16), rows.double()):
        assert best_tokens(logits) == torch.argmax(logits, dim=-1).tolist()
        assert [best_token(row) for row in logits] == best_tokens(logits)
    assert best_tokens(rows)[3] == 17


def test_a_draw_follows_the_weights_and_never_picks_a_token_of_weight_zero():
    from engine.sampling import Sampler

    weights = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0, 0.0])  # unnormalised is fine: scaled by 2 below
    sampler = Sampler(1.0, 0, 1.0, torch.Generator().manual_seed(3))
    draws = 30_000
    counts = torch.bincount(torch.tensor([sampler.draw(2 * weights) for _ in range(draws)]), minlength=len(weights)).double()
    assert counts[weights == 0].sum() == 0
    expected = weights[weights > 0].double() * draws
    chi_square = float(((counts[weights > 0] - expected) ** 2 / expected).sum())
    assert chi_square < 13.8  # 2 degrees of freedom, p = 0.001; drawing 0.1/0.6/0.3 as 0.2/0.5/0.3 scores ~700

    class LastDraw(Sampler):
        def uniform(self) -> float:  # the largest double below 1: the scaled point may round up to the total
            return 1.0 - 2.0 ** -53

    class FirstDraw(Sampler):
        def uniform(self) -> float:
            return 0.0

    assert LastDraw(1.0, 0, 1.0, None).draw(torch.tensor([0.3, 0.7, 0.0, 0.0])) == 1
    assert FirstDraw(1.0, 0, 1.0, None).draw(torch.tensor([0.0, 0.0, 0.4, 0.6])) == 2
    for broken in ([0.5, float("nan")], [0.5, -0.1, 0.6], [0.0, 0.0], [1.0, float("inf")]):
        with pytest.raises(ValueError, match="cannot draw a token"):
            sampler.draw(torch.tensor(broken))


def test_drawing_each_row_at_once_follows_each_rows_weights_with_its_own_generator(monkeypatch):
    from engine.sampling import Sampler, draw_each_row

    rows = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3], [0.5, 0.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0, 2.0]])
    generators = [torch.Generator().manual_seed(seed) for seed in (1, 2, 3)]
    draws = 20_000
    tokens = torch.stack([draw_each_row(rows, generators) for _ in range(draws)])  # (draws, 3)
    for row, weights in enumerate(rows):
        counts = torch.bincount(tokens[:, row], minlength=len(weights)).double()
        assert counts[weights == 0].sum() == 0
        expected = (weights[weights > 0] / weights.sum()).double() * draws
        chi_square = float(((counts[weights > 0] - expected) ** 2 / expected).sum())
        assert chi_square < 13.8  # at most 2 degrees of freedom, p = 0.001
    # Row by row the same token Sampler.draw gives from the same generator state: a reply
    # does not depend on which other replies share its batch.
    again = [torch.Generator().manual_seed(seed) for seed in (1, 2, 3)]
    one_by_one = [Sampler(1.0, 0, 1.0, generator).draw(weights) for generator, weights in zip(again, rows)]
    fresh = [torch.Generator().manual_seed(seed) for seed in (1, 2, 3)]
    assert draw_each_row(rows, fresh).tolist() == one_by_one
    for broken in ([[0.5, float("nan")]], [[0.5, -0.1, 0.6]], [[0.0, 0.0]], [[1.0, float("inf")]]):
        with pytest.raises(ValueError, match="cannot draw a token"):
            draw_each_row(torch.tensor(broken), [torch.Generator()])
    # the extreme uniforms land on tokens with weight, at either end
    edges = torch.tensor([[0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 0.4, 0.6]])
    for uniform, expected in ((1.0 - 2.0 ** -53, [1, 3]), (0.0, [0, 2])):
        monkeypatch.setattr(torch, "rand", lambda *args, uniform=uniform, **kwargs: torch.tensor(uniform, dtype=torch.float64))
        assert draw_each_row(edges, [None, None]).tolist() == expected


@pytest.mark.parametrize("top_p", [0.2, 0.9, 0.999])
def test_top_p_keeps_the_smallest_set_of_best_tokens_that_reaches_it(top_p):
    """Rows of different temperatures in one batch: nuclei of a few tokens to tens of
    thousands, so every width the search grows through is taken. Kept are the best tokens
    (nothing better is dropped), they reach top_p, and without the weakest of them they do not
    (to float32 rounding of the running sums)."""
    from engine.sampling import _keep_top_p

    generator = torch.Generator().manual_seed(int(top_p * 1000))
    scores = torch.randn(4, 49_152, generator=generator) * torch.tensor([[8.0], [3.0], [1.0], [0.3]])
    kept = ~torch.isinf(_keep_top_p(scores, top_p))
    probs = torch.softmax(scores.double(), dim=-1)
    for row in range(len(scores)):
        mine = probs[row][kept[row]]
        dropped = probs[row][~kept[row]]
        assert len(dropped) == 0 or float(dropped.max()) <= float(mine.min())  # the best ones
        assert float(mine.sum()) >= top_p - 1e-5
        assert float(mine.sum() - mine.min()) < top_p + 1e-5

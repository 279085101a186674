"""Sampling exactness: speculative sampling with token-level or block verification must
emit sequences distributed exactly as the target alone would emit them. Checked with a
chi-square test on a three-token vocabulary, which a deliberately broken verifier fails."""
from __future__ import annotations

import functools
import math
import random
import zlib
from collections import Counter

import pytest
import torch

from engine.sampling import Sampler
from engine.sampling import one_hot_rows
from engine.verifying.exact import Verdict, _residual, verify_block, verify_greedy, verify_token_level

VOCAB = 3
LENGTH = 3  # sequences of three tokens: 27 outcomes
SAMPLES = 20_000


@functools.lru_cache(maxsize=None)
def toy_distribution(model: str, prefix: tuple[int, ...]) -> torch.Tensor:
    """A fixed, prefix-dependent distribution; target and draft differ a lot."""
    rng = random.Random(zlib.crc32(repr((model, prefix)).encode()))  # stable across runs
    weights = [rng.gammavariate(0.8, 1.0) + 0.02 for _ in range(VOCAB)]
    total = sum(weights)
    return torch.tensor([w / total for w in weights])


def target_probability(sequence: tuple[int, ...]) -> float:
    probability = 1.0
    for i, token in enumerate(sequence):
        probability *= float(toy_distribution("target", sequence[:i])[token])
    return probability


def speculative_sequence(verify, k: int, sampler: Sampler, draft_kind: str = "model") -> tuple[int, ...]:
    """Decode LENGTH tokens with the toy draft and target, round after round."""
    context: list[int] = []
    while len(context) < LENGTH:
        draft_tokens, draft_rows = [], []
        for _ in range(k):
            q = toy_distribution("draft", tuple(context + draft_tokens))
            if draft_kind == "point":  # a deterministic drafter: always its own argmax
                token = int(torch.argmax(q))
                draft_rows.append(one_hot_rows([token], VOCAB)[0])
            else:
                token = sampler.draw(q)
                draft_rows.append(q)
            draft_tokens.append(token)
        target_rows = [toy_distribution("target", tuple(context + draft_tokens[:i])) for i in range(k + 1)]
        verdict = verify(draft_tokens, torch.stack(draft_rows), torch.stack(target_rows), sampler)
        context += draft_tokens[: verdict.accepted] + [verdict.next_token]
    return tuple(context[:LENGTH])


def chi_square_pvalue_exceeds(counts: Counter, samples: int, alpha: float = 1e-3) -> tuple[bool, float, float]:
    """Pearson's test against the target's exact sequence probabilities; cells expected
    fewer than 5 times are pooled. Returns (consistent, statistic, critical value)."""
    cells = [(seq, target_probability(seq) * samples) for seq in _all_sequences()]
    pooled_expected = pooled_observed = 0.0
    statistic, bins = 0.0, 0
    for seq, expected in cells:
        if expected < 5:
            pooled_expected += expected
            pooled_observed += counts[seq]
            continue
        statistic += (counts[seq] - expected) ** 2 / expected
        bins += 1
    if pooled_expected > 0:
        statistic += (pooled_observed - pooled_expected) ** 2 / pooled_expected
        bins += 1
    critical = _chi_square_quantile(1 - alpha, bins - 1)
    return statistic <= critical, statistic, critical


def _chi_square_quantile(level: float, df: int) -> float:
    """Wilson-Hilferty approximation; z for 0.999 is 3.0902."""
    z = {0.999: 3.0902}[round(level, 3)]
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def _all_sequences():
    for a in range(VOCAB):
        for b in range(VOCAB):
            for c in range(VOCAB):
                yield (a, b, c)


def sample_counts(verify, k: int, seed: int, draft_kind: str = "model") -> Counter:
    sampler = Sampler(temperature=1.0, generator=torch.Generator().manual_seed(seed))
    return Counter(speculative_sequence(verify, k, sampler, draft_kind) for _ in range(SAMPLES))


@pytest.mark.parametrize("verify", [verify_token_level, verify_block], ids=["token", "block"])
@pytest.mark.parametrize("k,draft_kind", [(2, "model"), (4, "model"), (3, "point")])
def test_speculative_sampling_reproduces_target_distribution(verify, k, draft_kind):
    consistent, statistic, critical = chi_square_pvalue_exceeds(sample_counts(verify, k, seed=k, draft_kind=draft_kind), SAMPLES)
    assert consistent, f"chi-square {statistic:.1f} > {critical:.1f}: output is not distributed as the target"


def residual_from_target_instead_of_difference(draft_tokens, draft_probs, target_probs, sampler) -> Verdict:
    """A plausible bug: on rejection, resample from p instead of norm(max(p - q, 0))."""
    for i, token in enumerate(draft_tokens):
        ratio = float(target_probs[i, token]) / float(draft_probs[i, token])
        if sampler.uniform() >= min(1.0, ratio):
            return Verdict(i, sampler.draw(target_probs[i]))
    return Verdict(len(draft_tokens), sampler.draw(target_probs[len(draft_tokens)]))


def block_with_early_stop(draft_tokens, draft_probs, target_probs, sampler) -> Verdict:
    """A plausible bug: block verification that stops at the first failing position."""
    weight, accepted, weights = 1.0, 0, [1.0]
    k = len(draft_tokens)
    for i, token in enumerate(draft_tokens, start=1):
        weight = min(1.0, weight * float(target_probs[i - 1, token]) / float(draft_probs[i - 1, token]))
        weights.append(weight)
        if i < k:
            leftover = float(torch.clamp(weight * target_probs[i] - draft_probs[i], min=0).sum())
            threshold = leftover / (leftover + 1 - weight) if leftover + 1 - weight > 0 else 1.0
        else:
            threshold = weight
        if sampler.uniform() > threshold:
            break
        accepted = i
    if accepted == k:
        return Verdict(k, sampler.draw(target_probs[k]))
    return Verdict(accepted, sampler.draw(_residual(target_probs[accepted], draft_probs[accepted], weights[accepted])))


@pytest.mark.parametrize("broken", [residual_from_target_instead_of_difference, block_with_early_stop])
def test_broken_verifiers_fail_the_distribution_test(broken):
    consistent, statistic, critical = chi_square_pvalue_exceeds(sample_counts(broken, 3, seed=7), SAMPLES)
    assert not consistent, f"a biased verifier passed (chi-square {statistic:.1f} <= {critical:.1f})"


def test_block_verification_accepts_more_on_the_papers_toy_case():
    """Sun et al.: binary vocabulary, target (1/3, 2/3), draft (2/3, 1/3), K = 2 gives
    10/9 accepted tokens per round token-level and 11/9 with block verification."""
    target = torch.tensor([[1 / 3, 2 / 3]] * 3)
    draft = torch.tensor([[2 / 3, 1 / 3]] * 2)
    sampler = Sampler(temperature=1.0, generator=torch.Generator().manual_seed(0))
    rounds = 20_000
    means = {}
    for name, verify in (("token", verify_token_level), ("block", verify_block)):
        total = 0
        for _ in range(rounds):
            tokens = [sampler.draw(draft[0]), sampler.draw(draft[1])]
            total += verify(tokens, draft, target, sampler).accepted
        means[name] = total / rounds
    assert means["token"] == pytest.approx(10 / 9, abs=0.03)
    assert means["block"] == pytest.approx(11 / 9, abs=0.03)


def test_greedy_verification_stops_at_first_mismatch():
    logits = torch.tensor([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    assert verify_greedy([1, 2], logits) == Verdict(1, 0)
    assert verify_greedy([1, 0], logits) == Verdict(2, 2)
    assert verify_greedy([], logits[:1]) == Verdict(0, 1)


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top_k = Sampler(temperature=1.0, top_k=2).probabilities(logits)[0]
    torch.testing.assert_close(top_k, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_p = Sampler(temperature=1.0, top_p=0.8).probabilities(logits)[0]  # 0.5 + 0.3 reaches 0.8
    torch.testing.assert_close(top_p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_p_more = Sampler(temperature=1.0, top_p=0.81).probabilities(logits)[0]
    assert (top_p_more > 0).sum() == 3

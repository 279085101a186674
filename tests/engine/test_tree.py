"""Token trees on tiny random models: one masked forward equals per-branch recomputation,
greedy tree decoding equals `ar`, the accepted path's cache entries are compacted correctly,
and sampled tree decoding follows the target's distribution (a biased verifier does not)."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from transformers import DynamicCache

import engine.verifying.exact
from engine.drafters.tree_drafter import TreeRound
from engine.drafters.backoff_ngram import BackoffNgram
from engine.drafters.base import NoDrafter
from engine.drafters.tree_drafter import TreeDrafter, TreeShape
from engine.runtime import ModelRuntime
from engine.sampling import Sampler
from engine.tree import TokenTree, TreeVerdict, forward_tree, keep_path
from engine.verifying.exact import verify_tree_greedy
from engine.tree_shape import AutoTreeShape, FixedTreeShape
from tests.engine.test_sampling_pipeline import PROMPT, SAMPLES, VOCAB, chi_square, critical_value, exact_two_token_distribution
from tests.engine.tiny_models import cached, run_round, tiny_llama


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_tree(rng: random.Random, root: int, size: int, vocab: int) -> TokenTree:
    tokens, parents = [root], [-1]
    for _ in range(size):
        parent = rng.randrange(len(tokens))
        taken = {tokens[n] for n in range(1, len(tokens)) if parents[n] == parent}
        free = [t for t in range(vocab) if t not in taken]
        if free:
            tokens.append(rng.choice(free))
            parents.append(parent)
    return TokenTree(tokens, parents)


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("seed", range(6))
def test_tree_logits_equal_per_branch_recomputation(seed):
    rng = random.Random(seed)
    model = tiny_llama(seed=seed)
    runner = cached(model)
    context = [rng.randrange(64) for _ in range(rng.randint(2, 30))]
    runner.logits_for(context[: rng.randint(1, len(context))])  # part of the context already cached
    tree = random_tree(rng, context[-1], rng.randint(1, 20), 64)
    logits = forward_tree(runner, context, tree)
    for node in range(len(tree)):
        branch = context + [tree.tokens[n] for n in tree.path(node)]
        torch.testing.assert_close(logits[node], full_logits(model, branch), atol=1e-4, rtol=1e-4)


def decode(target_model, context, rounds_until: int, step) -> list[int]:
    context = list(context)
    while len(context) < rounds_until:
        context += step(context)
    return context[:rounds_until]


def ar_reference(target_model, prompt, length):
    runner = cached(target_model)
    return decode(target_model, prompt, len(prompt) + length, lambda c: run_round(runner, NoDrafter(), c).tokens)


class SometimesPlain(FixedTreeShape):
    """A fixed shape whose rounds are plain target steps (no draft) at random, as an
    automatic shape's are where drafting does not pay: the draft then falls behind."""

    def __init__(self, shape: TreeShape, seed: float, plain_share: float = 0.5):
        super().__init__(shape)
        self.rng = random.Random(seed)
        self.plain_share = plain_share

    def speculate(self) -> bool:
        return self.rng.random() >= self.plain_share


@pytest.mark.parametrize("draft_seed", [0, 7], ids=["always-right", "mostly-wrong"])
@pytest.mark.parametrize("stage", [False, True], ids=["tree", "staged"])
def test_greedy_tree_decoding_equals_ar(draft_seed, stage):
    target_model = tiny_llama(seed=0)
    draft_model = target_model if draft_seed == 0 else tiny_llama(seed=draft_seed)
    prompt = [3, 14, 15, 9, 2, 6]
    reference = ar_reference(target_model, prompt, 48)
    rng = random.Random(draft_seed)
    for _ in range(4):
        shape = TreeShape(budget=rng.randint(1, 24), depth=rng.randint(1, 6), branching=rng.randint(1, 4), beam=rng.randint(1, 4))
        for policy in (FixedTreeShape(shape), AutoTreeShape(max_budget=shape.budget), SometimesPlain(shape, rng.random())):
            target = cached(target_model)
            drafter = TreeDrafter(cached(draft_model), 64, policy, BackoffNgram(64) if stage else None)
            output = decode(target_model, prompt, len(reference), lambda c: run_round(target, drafter, c).tokens)
            assert output == reference, f"{shape} {type(policy).__name__}"


@pytest.mark.parametrize("seed", range(20))
def test_greedy_verification_follows_a_planted_branch_through_random_trees(seed):
    """The target's own greedy continuation, hidden at a random place among random
    branches, is accepted in full; every other branch is cut where it first errs."""
    rng = random.Random(seed)
    model = tiny_llama(seed=3)
    context = [rng.randrange(64) for _ in range(6)]
    truth = ar_reference(model, context, 4)[len(context) :]
    tree = random_tree(rng, context[-1], rng.randint(0, 15), 64)
    # Plant the true continuation under the root, replacing any sibling that holds its token.
    tokens, parents = list(tree.tokens), list(tree.parents)
    node = 0
    for token in truth[:3]:
        child = next((n for n in range(len(tokens)) if parents[n] == node and tokens[n] == token), None)
        if child is None:
            tokens.append(token)
            parents.append(node)
            child = len(tokens) - 1
        node = child
    tree = TokenTree(tokens, parents)
    verdict = verify_tree_greedy(tree, forward_tree(cached(model), context, tree))
    assert [tree.tokens[n] for n in verdict.path] == truth[: len(verdict.path)]
    assert len(verdict.path) >= 3
    assert verdict.next_token == truth[len(verdict.path)]


def assert_cache_matches_fresh(model, runner: ModelRuntime):
    """Every cached key and value equals those of a fresh forward over the cached ids."""
    if not runner.cached_ids:  # a draft that has only sat out plain rounds so far
        return
    fresh = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([runner.cached_ids]), past_key_values=fresh, use_cache=True)
    for kept, recomputed in zip(runner.cache.layers, fresh.layers):
        torch.testing.assert_close(kept.keys, recomputed.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(kept.values, recomputed.values, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("stage", [False, True], ids=["tree", "staged"])
def test_compacted_caches_equal_a_fresh_recompute_after_many_rounds(stage):
    vocab = 12  # small, so that a random draft's trees are often partly right
    target_model, draft_model = tiny_llama(seed=4, vocab_size=vocab), tiny_llama(seed=5, vocab_size=vocab)
    target, draft = cached(target_model), cached(draft_model)
    stage_model = BackoffNgram(vocab) if stage else None
    sampler = Sampler(temperature=1.0, generator=torch.Generator().manual_seed(0))
    rng = random.Random(1)
    context = [1, 2, 3, 4]
    accepted = Counter()
    for _ in range(80):
        shape = TreeShape(budget=rng.randint(1, 16), depth=rng.randint(1, 5), branching=rng.randint(1, 4), beam=rng.randint(1, 3))
        policy = SometimesPlain(shape, rng.random(), plain_share=0.25)
        outcome = run_round(target, TreeDrafter(draft, vocab, policy, stage_model), context, sampler)
        accepted[outcome.accepted] += 1
        context += outcome.tokens
        assert target.cached_ids == context[: len(target)]
        assert draft.cached_ids == context[: len(draft)]
        assert_cache_matches_fresh(target_model, target)
        assert_cache_matches_fresh(draft_model, draft)
    assert len(accepted) >= 3, f"the rounds should accept varied path lengths: {accepted}"


def test_the_root_must_be_the_last_context_token():
    with pytest.raises(ValueError):
        forward_tree(cached(tiny_llama(seed=0)), [1, 2, 3], TokenTree.chain(9, [4]))


def test_siblings_must_differ():
    with pytest.raises(ValueError):
        TokenTree([0, 5, 5], [-1, 0, 0])


# --- sampling exactness over trees ------------------------------------------------------


def biased_per_path_verifier(tree: TokenTree, target_logits: torch.Tensor, sampler: Sampler) -> TreeVerdict:
    """The bug ALGORITHMS.md warns about: sample along every root-to-leaf path separately
    and keep the longest match. Tree tokens then come out too often."""
    leaves = [n for n in range(len(tree)) if tree.child_count(n) == 0]
    best: TreeVerdict | None = None
    for leaf in leaves:
        path, node = [], 0
        for child in tree.path(leaf) + [None]:
            token = sampler.draw(sampler.probabilities(target_logits[node][None])[0])
            if child is None or tree.tokens[child] != token:
                break
            path.append(child)
            node = child
        if best is None or len(path) > len(best.path):
            best = TreeVerdict(path, token)
    return best


def first_two_tokens_from_trees(seed: int) -> tuple[Counter, dict]:
    target_model = tiny_llama(seed=1, vocab_size=VOCAB)
    draft_model = tiny_llama(seed=2, vocab_size=VOCAB)
    sampler = Sampler(temperature=1.3, top_k=6, top_p=0.9, generator=torch.Generator().manual_seed(seed))
    target = cached(target_model)
    drafter = TreeDrafter(cached(draft_model), VOCAB, FixedTreeShape(TreeShape(budget=6, depth=2, branching=3, beam=2)))
    counts: Counter = Counter()
    for _ in range(SAMPLES):
        context = list(PROMPT)
        while len(context) < len(PROMPT) + 2:
            context += run_round(target, drafter, context, sampler).tokens
        counts[tuple(context[len(PROMPT) : len(PROMPT) + 2])] += 1
    return counts, exact_two_token_distribution(target_model, sampler)


def test_sampled_tree_decoding_follows_the_target_distribution():
    counts, expected = first_two_tokens_from_trees(seed=11)
    statistic, df = chi_square(counts, expected, SAMPLES)
    assert statistic <= critical_value(df), f"chi-square {statistic:.1f} on {df} df"


def test_a_per_path_tree_verifier_is_caught(monkeypatch):
    monkeypatch.setattr(engine.verifying.exact, "verify_tree_sampled", biased_per_path_verifier)
    counts, expected = first_two_tokens_from_trees(seed=11)
    statistic, df = chi_square(counts, expected, SAMPLES)
    assert statistic > critical_value(df), f"a biased verifier passed: chi-square {statistic:.1f} on {df} df"


# --- the automatic shape ----------------------------------------------------------------


def calibrated(cost_per_token: float) -> AutoTreeShape:
    shape = AutoTreeShape(max_budget=64)
    shape.calibrate(lambda tokens: 0.020 + cost_per_token * tokens)
    return shape


def test_auto_budget_grows_where_verifying_more_tokens_is_cheap():
    candidates = [(1 + i // 8, -0.3 * (1 + i // 8)) for i in range(64)]  # confident, shallow-first
    flat, steep = calibrated(0.00001), calibrated(0.004)
    assert flat.choose_budget(candidates) > steep.choose_budget(candidates) >= 1


def test_auto_depth_follows_measured_acceptance():
    def trained(reaches: bool) -> int:
        shape = calibrated(0.0002)
        for _ in range(30):
            shape.record(TreeRound(
                depths=[0, 1, 2, 3, 4], scores=[0.0, -0.1, -0.2, -0.3, -0.4], accepted_depth=4 if reaches else 0,
                tokens=5 if reaches else 1, draft_seconds=0.004, draft_calls=4,
                verify_tokens=5, verify_seconds=0.021, round_seconds=0.025,
            ))
        return shape.depth

    assert trained(reaches=True) > trained(reaches=False)


def test_auto_shape_drafts_only_while_trees_beat_plain_steps():
    def speculating_rounds(tokens_per_tree_round: int) -> int:
        shape = calibrated(0.004)  # 24 ms for one token, 52 ms for eight
        drafted = 0
        for _ in range(64):
            if shape.speculate():
                drafted += 1
                depths, scores = [0, 1, 1, 2, 2, 3, 3, 3], [0.0, -0.5, -1.0, -1.0, -1.5, -1.5, -2.0, -2.5]
                shape.record(TreeRound(
                    depths, scores, accepted_depth=tokens_per_tree_round - 1, tokens=tokens_per_tree_round,
                    draft_seconds=0.012, draft_calls=3, verify_tokens=8, verify_seconds=0.052, round_seconds=0.066,
                ))
            else:
                shape.record(TreeRound(
                    [0], [0.0], accepted_depth=0, tokens=1,
                    draft_seconds=0.0, draft_calls=0, verify_tokens=1, verify_seconds=0.024, round_seconds=0.025,
                ))
        return drafted

    # 1.2 tokens per 66 ms round lose to one token per 25 ms: only the exploring rounds draft.
    assert speculating_rounds(1) <= 64 // 16 + 2
    # 3 tokens per 66 ms beat it: every round drafts.
    assert speculating_rounds(3) == 64


def test_reach_by_depth_never_rises_with_depth():
    shape = calibrated(0.0002)
    shallow = ([0, 1, 2], [0.0, -0.1, -0.2], 0)  # 20 rounds whose trees stop at depth 2, all rejected
    deep = ([0, 1, 2, 3, 4], [0.0, -0.1, -0.2, -0.3, -0.4], 4)  # one deep tree, accepted in full
    for depths, scores, accepted_depth in [shallow] * 20 + [deep]:
        shape.record(TreeRound(
            depths, scores, accepted_depth=accepted_depth, tokens=accepted_depth + 1, draft_seconds=0.004,
            draft_calls=len(depths) - 1, verify_tokens=len(depths), verify_seconds=0.021, round_seconds=0.025,
        ))
    reach = [shape.reach_probability(depth) for depth in range(1, 7)]
    assert all(deeper <= shallower for shallower, deeper in zip(reach, reach[1:])), reach
    assert reach[3] < 0.1  # one lucky round in 21 does not make depth 4 likely


def test_auto_depth_stays_shallow_where_plain_steps_beat_tree_rounds():
    shape = calibrated(0.004)
    for _ in range(32):
        if shape.speculate():  # slow tree rounds that rarely go past depth 1
            shape.record(TreeRound(
                [0, 1, 2, 3], [0.0, -0.5, -1.0, -1.5], accepted_depth=1, tokens=2, draft_seconds=0.015,
                draft_calls=3, verify_tokens=4, verify_seconds=0.036, round_seconds=0.120,
            ))
        else:  # plain steps at 40 tokens/s
            shape.record(TreeRound([0], [0.0], accepted_depth=0, tokens=1, draft_seconds=0.0, draft_calls=0,
                                   verify_tokens=1, verify_seconds=0.024, round_seconds=0.025))
    # No tree round ever reached depth 2: its estimated chance (~0.1) per 5 ms draft call is
    # ~20 tokens/s, more than the tree rounds' own 17 but half the plain steps' 40. Deeper
    # trees would only make the exploring rounds dearer.
    assert shape.depth <= 2

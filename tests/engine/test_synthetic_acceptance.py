"""Synthetic acceptance (engine/verifying/synthetic.py): draft tokens kept at random at given
per-depth rates, with the drafters and the target running for real."""
from __future__ import annotations

import pytest
import torch

from engine.chat_prompt import Message
from engine.config import ConfigError, DecodeSettings, ModelSpec, PairConfig
from engine.events import Finished
from engine.models import LoadedModel
from engine.session import LoadedPair
from engine.tools.bench import Bench, format_table
from engine.drafters.base import Proposal
from engine.sampling import Sampler
from engine.tree import TokenTree
from engine.verifying.synthetic import conditional_rates, synthetic_verifier

from .tiny_models import TEMPLATE, WORDS, tiny_llama

RATES = (0.8, 0.64, 0.51, 0.41)  # llama.cpp's --spec-synth-rates form: the chance to reach each depth


@pytest.fixture
def pair(make_word_tokenizer) -> LoadedPair:
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    target = LoadedModel(tiny_llama(seed=3, vocab_size=64), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=512)
    draft = LoadedModel(tiny_llama(seed=4, vocab_size=64), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=512)
    loaded = LoadedPair(PairConfig("tiny", ModelSpec("tiny"), ModelSpec("tiny-draft")), target, draft)
    loaded.stop_token_ids = frozenset()
    return loaded


def reply(pair: LoadedPair, settings: DecodeSettings) -> Finished:
    return [event for event in pair.generate([Message("user", "w1 w2 w3")], settings) if isinstance(event, Finished)][0]


def test_the_conditional_chances_multiply_back_to_the_rates():
    chances = conditional_rates(RATES)
    reached = 1.0
    for chance, rate in zip(chances, RATES):
        reached *= chance
        assert reached == pytest.approx(rate)


def reached_depths(tree: TokenTree, rounds: int) -> list[float]:
    """Of `rounds` verdicts on `tree`, the share that kept each depth (1..4)."""
    verify = synthetic_verifier(RATES, stop_ids=frozenset(), seed=11)
    logits = torch.zeros(len(tree), 8)
    kept = [0] * len(RATES)
    for _ in range(rounds):
        verdict = verify(Proposal(tree), logits, Sampler(0.0))
        assert verdict.next_token == 0  # the target's own token after the kept ones
        for depth in range(len(verdict.path)):
            kept[depth] += 1
    return [count / rounds for count in kept]


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_acceptance_by_depth_follows_the_rates(shape):
    """A chain of 4, and a tree whose deepest branch is not its first child: each depth is
    kept at its rate, within four standard errors of 4,000 rounds."""
    if shape == "chain":
        tree = TokenTree.chain(1, [2, 3, 4, 5])
    else:  # root -> a (leaf), root -> b -> c -> d -> e; b's branch is the one 4 deep
        tree = TokenTree([1, 2, 3, 4, 5, 6], [-1, 0, 0, 2, 3, 4])
    rounds = 4000
    for depth, (measured, rate) in enumerate(zip(reached_depths(tree, rounds), RATES)):
        standard_error = (rate * (1 - rate) / rounds) ** 0.5
        assert abs(measured - rate) < 4 * standard_error, (depth, measured, rate)


def test_every_method_drafts_for_real_and_keeps_what_the_rates_say(pair):
    """Through the session: rates of 1 keep every drafted token, rates of 0 none, whatever
    the two random models would agree on."""
    for method in ("chain", "tree"):
        settings = DecodeSettings(method=method, max_new_tokens=24, draft_tokens=3, tree_shape="6x3", seed=7)
        always = reply(pair, settings.with_changes(synthetic_acceptance=(1.0, 1.0, 1.0))).stats
        never = reply(pair, settings.with_changes(synthetic_acceptance=(0.0, 0.0, 0.0))).stats
        assert always.draft_tokens_proposed > 0 and always.draft_tokens_accepted == always.draft_tokens_proposed
        assert never.draft_tokens_proposed > 0 and never.draft_tokens_accepted == 0


def test_plain_decoding_is_unchanged_and_a_drafted_stop_token_is_never_kept(pair):
    plain = reply(pair, DecodeSettings(method="ar", max_new_tokens=30))
    synthetic = reply(pair, DecodeSettings(method="ar", max_new_tokens=30, synthetic_acceptance=RATES))
    assert synthetic.token_ids == plain.token_ids  # nothing drafted, nothing to keep

    pair.stop_token_ids = frozenset(range(64))  # every token a stop token: no drafted one may be kept
    ended = reply(pair, DecodeSettings(method="chain", max_new_tokens=30, synthetic_acceptance=(1.0, 1.0, 1.0, 1.0)))
    assert ended.stop_reason == "eos" and ended.token_ids == ()  # the target's own token ended it
    assert ended.stats.draft_tokens_proposed > 0 and ended.stats.draft_tokens_accepted == 0


def test_rates_that_grow_with_depth_or_leave_zero_to_one_are_refused():
    with pytest.raises(ConfigError, match="increase"):
        DecodeSettings(synthetic_acceptance=(0.5, 0.6))
    with pytest.raises(ConfigError, match="within"):
        DecodeSettings(synthetic_acceptance=(1.5,))
    with pytest.raises(ConfigError, match="approximate"):
        DecodeSettings(method="sprinter", synthetic_acceptance=(0.8,))


def test_the_bench_report_says_the_replies_are_not_text(pair):
    settings = DecodeSettings(max_new_tokens=24, draft_tokens=4, seed=1, synthetic_acceptance=RATES)
    report = Bench(pair, settings).run(["w1 w2"], ["ar", "chain"], progress=lambda _: None)
    assert report["synthetic_acceptance"] == list(RATES)
    assert all(row.get("target_nll") is None for row in report["results"])  # not scored as text
    assert "SYNTHETIC ACCEPTANCE" in format_table(report) and "not valid text" in format_table(report)

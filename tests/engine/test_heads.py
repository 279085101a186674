"""SPRINTER's verifier and SpecDec++'s acceptance head: calibration on a tiny random pair,
the files they are kept in, and the two decoding methods that read them."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from engine.chat_prompt import Message
from engine.config import ConfigError, DecodeSettings, ModelSpec, PairConfig
from engine.errors import ModelLoadError
from engine.events import Finished, Provenance
from engine.tools.calibrate.calibrate import CalibrationCancelled, CalibrationSettings, calibrate
from engine.heads.store import CARD_FILE, MODES, WEIGHTS_FILE, load_heads, save_heads
from engine.models import LoadedModel
from engine.session import LoadedPair, method_refusal
from tests.engine.heads_fixtures import fixed_heads, tiny_draft_pair
from tests.engine.tiny_models import WORDS

PROMPT = [Message("user", "w1 w2 w3 w4 w5 w6")]


@pytest.fixture
def pair(make_word_tokenizer):
    return tiny_draft_pair(make_word_tokenizer)


def reply(pair, **settings) -> Finished:
    events = list(pair.generate(PROMPT, DecodeSettings(**{"max_new_tokens": 40, **settings})))
    return events[-1]


def word_prompts(count: int, seed: int = 0) -> list[str]:
    chooser = random.Random(seed)
    return [" ".join(chooser.choice(WORDS) for _ in range(chooser.randint(3, 12))) for _ in range(count)]


# Calibration


def test_calibrated_heads_beat_a_constant_predictor_on_held_out_prompts(pair, tmp_path):
    settings = CalibrationSettings(prompts=40, max_new_tokens=48, training_steps=200)
    phases = []
    heads = calibrate(pair, settings, progress=lambda phase, done, total: phases.append(phase), out_folder=tmp_path, prompts=word_prompts(40))
    for mode in MODES:
        sprinter, acceptance = heads.card["modes"][mode]["sprinter"], heads.card["modes"][mode]["acceptance"]
        assert sprinter["heldout_examples"] > 100
        assert sprinter["bce"] < sprinter["constant_bce"], mode
        assert acceptance["bce"] < acceptance["constant_bce"], mode
        assert sprinter["false_positive_rate"] <= 0.1 + 1e-9  # the threshold's promise, on held-out data
    assert {"replies", "training"} <= set(phases)
    assert heads.card["target"] == "tiny" and heads.card["draft"] == "tiny-draft"
    assert {"adaptive", "sprinter"} <= set(pair.methods)  # attached to the pair at once


def test_heads_survive_a_round_trip_through_safetensors(pair, tmp_path):
    heads = calibrate(pair, CalibrationSettings(prompts=20, max_new_tokens=24, training_steps=30), out_folder=tmp_path, prompts=word_prompts(20))
    loaded = load_heads(tmp_path)
    features = torch.randn(5, heads.feature_width)
    for mode in MODES:
        torch.testing.assert_close(loaded.verifiers[mode](features), heads.verifiers[mode](features))
        torch.testing.assert_close(loaded.acceptance_heads[mode](features), heads.acceptance_heads[mode](features))
        assert loaded.threshold(mode) == heads.threshold(mode)


def test_a_corrupt_heads_file_is_a_clear_error_and_the_pair_still_loads(pair, tmp_path, make_word_tokenizer, monkeypatch):
    save_heads(tmp_path, fixed_heads(passes=True))
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(ModelLoadError, match="calibrate"):
        load_heads(tmp_path)
    monkeypatch.setattr("engine.heads.store.user_heads_folder", lambda name: tmp_path)
    (tmp_path / CARD_FILE).write_text((tmp_path / CARD_FILE).read_text().replace('"modes"', '"target": "tiny", "draft": "tiny-draft", "modes"'))
    reloaded = tiny_draft_pair(make_word_tokenizer)
    assert "sprinter" not in reloaded.methods and "cannot be read" in reloaded.heads_problem
    assert "cannot be read" in method_refusal(reloaded, "sprinter")
    assert reply(reloaded, method="chain").stop_reason == "length"  # everything else still works


def test_cancelling_a_calibration_saves_nothing(pair, tmp_path):
    with pytest.raises(CalibrationCancelled):
        calibrate(pair, CalibrationSettings(prompts=10), out_folder=tmp_path, prompts=word_prompts(10), should_stop=lambda: True)
    assert not (tmp_path / CARD_FILE).exists()
    assert "sprinter" not in pair.methods


def test_without_heads_the_methods_are_refused_with_what_to_do(pair):
    assert "adaptive" not in pair.methods
    with pytest.raises(ConfigError, match="tandem calibrate --pair tiny"):
        reply(pair, method="sprinter")


# SpecDec++: adaptive draft length, exact


@pytest.mark.parametrize("acceptance_logit", [-3.0, 0.0, 4.0])
def test_adaptive_greedy_output_is_exactly_the_targets(pair, acceptance_logit):
    pair.attach_heads(fixed_heads(passes=True, acceptance_logit=acceptance_logit))
    reference = reply(pair, method="ar")
    adaptive = reply(pair, method="adaptive")
    assert adaptive.token_ids == reference.token_ids
    assert adaptive.stats.exact


def test_the_stop_rule_sets_the_draft_length(pair):
    """P(accept) = sigmoid(4) = 0.982 per token: 1 - 0.982^k passes h = 0.1 at the 6th token;
    sigmoid(-3) stops after the first. Each round proposes exactly that many (room allowing)."""
    pair.attach_heads(fixed_heads(passes=True, acceptance_logit=4.0))
    long_rounds = reply(pair, method="adaptive", adaptive_stop_threshold=0.1).stats
    assert len(long_rounds.proposed_by_position) == 6  # no round drafted a 7th token
    pair.attach_heads(fixed_heads(passes=True, acceptance_logit=-3.0))
    short_rounds = reply(pair, method="adaptive").stats
    assert len(short_rounds.proposed_by_position) == 1


def test_adaptive_sampling_follows_the_targets_distribution(pair):
    """The first two sampled tokens, many times over: chi-square against ar's own counts."""
    pair.attach_heads(fixed_heads(passes=True, acceptance_logit=1.0))
    counts = {}
    for method in ("ar", "adaptive"):
        counts[method] = Counter(
            reply(pair, method=method, max_new_tokens=2, temperature=0.7, seed=seed).token_ids for seed in range(600)
        )
    assert two_sample_chi_square_passes(counts["ar"], counts["adaptive"])


# SPRINTER


def test_sprinter_that_flags_every_token_is_exact_chain_decoding(pair):
    pair.attach_heads(fixed_heads(passes=False))
    for temperature in (0.0, 0.7):
        chain = reply(pair, method="chain", draft_tokens=1, temperature=temperature, seed=3)
        sprinter = reply(pair, method="sprinter", temperature=temperature, seed=3)
        assert sprinter.token_ids == chain.token_ids
        assert Provenance.UNCHECKED not in sprinter.provenance
        assert sprinter.stats.target_calls == chain.stats.target_calls and sprinter.stats.unchecked_tokens == 0


def test_sprinter_that_passes_every_token_is_the_draft_alone(pair, make_word_tokenizer):
    pair.attach_heads(fixed_heads(passes=True))
    draft_only = LoadedPair(PairConfig("draft", ModelSpec("tiny-draft")), pair.draft, None)
    draft_only.stop_token_ids = frozenset()
    for temperature in (0.0, 0.7):
        alone = list(draft_only.generate(PROMPT, DecodeSettings(method="ar", max_new_tokens=40, temperature=temperature, seed=5)))[-1]
        sprinter = reply(pair, method="sprinter", temperature=temperature, seed=5, sprinter_max_unchecked=7)
        assert sprinter.token_ids == alone.token_ids
        assert set(sprinter.provenance) == {Provenance.UNCHECKED}
        assert sprinter.stats.target_calls == 0 and sprinter.stats.target_calls_skipped == 6  # ceil(40 / 7)
        assert not sprinter.stats.exact


def test_sprinter_with_passing_verifier_fails_the_distribution_test(pair):
    """The statistical test has the power to see an approximate method: SPRINTER letting
    every token through follows the draft, not the target."""
    pair.attach_heads(fixed_heads(passes=True))
    counts = {}
    for method in ("ar", "sprinter"):
        counts[method] = Counter(
            reply(pair, method=method, max_new_tokens=2, temperature=0.7, seed=seed).token_ids for seed in range(600)
        )
    assert not two_sample_chi_square_passes(counts["ar"], counts["sprinter"])


def two_sample_chi_square_passes(first: Counter, second: Counter) -> bool:
    """Two-sample chi-square homogeneity test at the 0.999 level (cells with few counts pooled)."""
    import math

    total_first, total_second = sum(first.values()), sum(second.values())
    cells = sorted(set(first) | set(second), key=lambda cell: -(first[cell] + second[cell]))
    statistic, bins, pooled = 0.0, 0, [0, 0]
    for cell in cells:
        a, b = first[cell], second[cell]
        if a + b < 10:
            pooled[0] += a
            pooled[1] += b
            continue
        statistic += _cell(a, b, total_first, total_second)
        bins += 1
    if sum(pooled):
        statistic += _cell(pooled[0], pooled[1], total_first, total_second)
        bins += 1
    df = max(bins - 1, 1)
    critical = df * (1 - 2 / (9 * df) + 3.0902 * math.sqrt(2 / (9 * df))) ** 3
    return statistic <= critical


def _cell(a: int, b: int, total_first: int, total_second: int) -> float:
    both = a + b
    expected_a = both * total_first / (total_first + total_second)
    expected_b = both * total_second / (total_first + total_second)
    return (a - expected_a) ** 2 / expected_a + (b - expected_b) ** 2 / expected_b

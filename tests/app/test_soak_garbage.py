"""`tandem soak --score-replies` on a real (tiny) pair: the garbage check passes sound replies
and catches a decoder that writes garbage or corrupts the target's cache."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from app.soak import SoakPlan, run_soak
from app.soak_scoring import ScoredReply, judge, verdict_lines
from engine import session
from engine.config import ModelSpec, PairConfig
from engine.models import LoadedModel
from engine.session import LoadedPair
from engine.tools.reply_score import longest_loop
from tests.engine.tiny_models import TEMPLATE, WORDS, tiny_llama

PROMPT = "w1 w2 w3 w4"
# One question per conversation and no stops: at temperature 0 every exact method writes the
# reply plain decoding writes, so a sound soak's scores are the same for every method.
PLAN = SoakPlan(
    replies=8, max_new_tokens=12, warmup=2, pair_every=100, stop_every=100, conversation_length=1,
    score_replies=True, reference_replies=2, temperature=0.0,
)


class TinyEngine:
    """Loads a tiny random target with a tiny draft model: every method of a draft-model pair."""

    def __init__(self, make_word_tokenizer):
        self.make_word_tokenizer = make_word_tokenizer

    def load_pair(self, config, progress):
        tokenizer = self.make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")

        def loaded(seed: int) -> LoadedModel:
            return LoadedModel(tiny_llama(seed, vocab_size=64), tokenizer, torch.device("cpu"), torch.float32, "fp32", f"tiny{seed}", context_length=256)

        pair = LoadedPair(PairConfig(config.name, ModelSpec("tiny")), loaded(3), loaded(5) if config.draft else None)
        pair.stop_token_ids = frozenset()  # every reply runs to its token limit
        return pair


def soaked(make_word_tokenizer, tmp_path, plan: SoakPlan = PLAN):
    pair = PairConfig("tiny", ModelSpec("tiny"), draft=ModelSpec("tiny-draft"))
    return run_soak(TinyEngine(make_word_tokenizer), pair, plan, tmp_path / "chats.sqlite3", [PROMPT], progress=lambda _: None)


def garbage_check(report):
    return next(check for check in report.checks() if check.name == "garbage")


def test_sound_replies_are_scored_and_pass(qtbot, tmp_path, make_word_tokenizer):
    report = soaked(make_word_tokenizer, tmp_path)

    assert report.passed, report.checks()
    assert {reply.method for reply in report.replies} >= {"auto", "ar", "chain", "tree"}
    scores = [reply.score for reply in report.replies]
    assert all(score["tokens"] == 12 and score["nll_per_token"] is not None for score in scores)
    assert len({round(score["nll_per_token"], 6) for score in scores}) == 1  # greedy: the same reply every time
    assert all(score["cache_problem"] is None and "target" in score["cache_gaps"] for score in scores)
    # The draft's cache is checked where it holds something: always after a reply that drafted with it
    assert all("draft" in reply.score["cache_gaps"] for reply in report.replies if reply.method in ("chain", "tree", "staged"))
    assert max(gap for score in scores for gap in score["cache_gaps"].values()) < 1e-3
    garbage = report.to_dict()["garbage"]
    plain = [reply for reply in report.replies if reply.method == "ar"]
    assert garbage["above"] == [] and garbage["reference_judged"] == len(plain) >= 3  # the two reference replies too


def test_a_decoder_that_writes_garbage_fails_the_check(qtbot, tmp_path, make_word_tokenizer, monkeypatch):
    play_round = session.play_round

    def chain_writes_one_token_over_and_over(target, drafter, verify, context, room, sampler):
        outcome = play_round(target, drafter, verify, context, room, sampler)
        if type(drafter).__name__ != "ModelDrafter":  # `chain`'s own rounds, not those it runs for `auto`
            return outcome
        return dataclasses.replace(outcome, tokens=[63] * len(outcome.tokens))  # "||||KKKK…"

    monkeypatch.setattr(session, "play_round", chain_writes_one_token_over_and_over)
    report = soaked(make_word_tokenizer, tmp_path)

    check = garbage_check(report)
    assert not check.passed and not report.passed
    above = report.to_dict()["garbage"]["above"]
    chain_replies = [reply.index for reply in report.replies if reply.method == "chain"]
    assert [reply["index"] for reply in above] == chain_replies and chain_replies
    assert all(reply["text"] == " ".join([WORDS[-1]] * 12) for reply in above)
    assert f"{len(chain_replies)} above" in check.detail


def test_a_decoder_that_corrupts_the_targets_cache_fails_the_check(qtbot, tmp_path, make_word_tokenizer, monkeypatch):
    play_round = session.play_round

    def trees_corrupt_the_cache(target, drafter, verify, context, room, sampler):
        outcome = play_round(target, drafter, verify, context, room, sampler)
        if type(drafter).__name__ == "TreeDrafter":  # `tree` and `staged`
            with torch.inference_mode():  # the cache's tensors are inference tensors
                target.cache.layers[0].values.add_(3.0)  # (B, H, T, D): every cached token's values, layer 0
        return outcome

    monkeypatch.setattr(session, "play_round", trees_corrupt_the_cache)
    report = soaked(make_word_tokenizer, tmp_path)

    check = garbage_check(report)
    assert not check.passed
    failures = report.to_dict()["garbage"]["cache_failures"]
    first_tree = next(reply for reply in report.replies if reply.method in ("tree", "staged"))
    assert failures[0].startswith(f"reply {first_tree.index + 1} ({first_tree.method}): the target cache is ")
    assert "cache failures" in check.detail


def scored(index: int, method: str, nll: float, tokens: int = 20, gap: float = 0.0) -> ScoredReply:
    return ScoredReply(index, method, "q", "a", {"tokens": tokens, "nll_per_token": nll, "cache_gaps": {"target": gap}, "cache_problem": None})


def test_the_verdict_compares_with_plain_decodings_worst_and_leaves_short_replies_unjudged():
    replies = [scored(0, "ar", 1.2), scored(1, "ar", 2.0), scored(2, "auto", 1.9), scored(3, "chain", 2.5),
               scored(4, "auto", 9.0, tokens=3), scored(5, "auto", 2.0)]
    verdict = judge(replies, min_tokens=8)

    assert verdict.reference_worst == 2.0 and verdict.reference_judged == 2
    assert [reply.index for reply in verdict.above] == [3]  # the 3-token reply is not judged
    assert not verdict.passed
    assert judge(replies[:3]).passed
    assert not judge([scored(0, "ar", 1.0), scored(1, "auto", 1.0, gap=0.5)]).passed  # a cache off by half a nat
    assert not judge([scored(0, "auto", 1.0)]).passed  # nothing to compare with


@pytest.mark.parametrize("auto_every, expected", [(0, ["auto", "ar", "chain", "auto"]), (2, ["auto", "ar", "auto", "chain"])])
def test_the_plan_makes_every_nth_reply_auto_and_ends_with_the_reference(auto_every, expected):
    plan = SoakPlan(replies=4, warmup=1, auto_every=auto_every, reference_replies=2)
    offered = ("auto", "ar", "chain")

    assert [plan.method(index, offered) for index in range(plan.total)] == expected + ["ar", "ar"]


def test_a_reply_that_repeats_itself_is_measured_by_its_longest_loop():
    assert longest_loop([]) == longest_loop([5]) == longest_loop([1, 2, 3, 4]) == 0
    assert longest_loop([7, 7, 7, 7, 7]) == 4  # "||||" : each token after the first repeats the one before
    assert longest_loop([1, 2] * 10) == 18  # a two-token phrase ten times
    assert longest_loop([9, 1, 2, 3, 1, 2, 3, 8]) == 3  # a phrase written twice, then on
    assert longest_loop(list(range(1, 10)) * 2) == 0  # a period past LONGEST_PERIOD is not a loop


def test_a_reply_that_loops_longer_than_plain_decoding_ever_did_fails_even_at_a_low_nll():
    def looped(index: int, method: str, loop: int) -> ScoredReply:
        reply = scored(index, method, 0.5)
        return dataclasses.replace(reply, score=reply.score | {"longest_loop": loop})

    replies = [looped(0, "ar", 3), looped(1, "ar", 6), looped(2, "auto", 6), looped(3, "chain", 30)]
    verdict = judge(replies)
    assert verdict.above == []  # the looping reply's NLL is the lowest of all
    assert verdict.reference_loop == 6 and [reply.index for reply in verdict.looping] == [3]
    assert not verdict.passed
    passed, detail, lines = verdict_lines(verdict)
    assert not passed and "1 longer" in detail and "repeats itself for 30" in lines[0]
    assert judge(replies[:3]).passed
    assert judge([scored(0, "ar", 1.0), scored(1, "auto", 1.0)]).passed  # reports from before the loop check


def test_the_cache_gap_reads_a_reduced_vocabularys_distribution_and_never_hides_behind_nan():
    from engine.tools.reply_score import distribution_gap

    logits = torch.tensor([2.0, 1.0, -float("inf"), 0.5])  # token 2 is outside a reduced vocabulary
    assert distribution_gap(logits, logits.clone()) == 0.0
    moved = logits.clone()
    moved[0] = 3.0
    assert 0.3 < distribution_gap(moved, logits) < 1.0
    reopened = logits.clone()
    reopened[2] = 0.0  # a dropped token the other cache gives a probability
    assert distribution_gap(reopened, logits) == float("inf")
    # A gap that is NaN fails the check rather than passing it
    assert not judge([scored(0, "ar", 1.0), scored(1, "auto", 1.0, gap=float("nan"))]).passed

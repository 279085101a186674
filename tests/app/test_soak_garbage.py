"""`tandem soak --score-replies` on a real (tiny) pair: the garbage check passes sound replies
and catches a decoder that writes garbage or corrupts the target's cache."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch

from app.soak import SoakPlan, run_soak
from app.soak_scoring import POOLED, ScoredReply, judge, verdict_lines
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
    garbage = report.to_dict()["garbage"]
    chain_replies = [reply.index for reply in report.replies if reply.method == "chain"]
    # Too few replies for the tests: the garbage fails alone, past twice plain decoding's worst NLL
    assert [reply["index"] for reply in garbage["catastrophic"]] == chain_replies and chain_replies
    assert [reply["index"] for reply in garbage["above"]] == chain_replies and garbage["above_count"] == len(chain_replies)
    assert all(reply["text"] == " ".join([WORDS[-1]] * 12) for reply in garbage["above"])
    assert f"{len(chain_replies)} replies past a guard" in check.detail and f"{len(chain_replies)} above" in check.detail


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


def test_replies_above_plain_decodings_worst_are_listed_to_look_at_and_short_replies_are_not_judged():
    replies = [scored(0, "ar", 1.2), scored(1, "ar", 2.0), scored(2, "auto", 1.9), scored(3, "chain", 2.5),
               scored(4, "auto", 9.0, tokens=3), scored(5, "auto", 2.0)]
    verdict = judge(replies, min_tokens=8)

    assert verdict.reference_worst == 2.0 and verdict.reference_judged == 2
    assert [reply.index for reply in verdict.above] == [3]  # the 3-token reply is not judged
    # The issue's rule lists reply 3, but one reply a little above the worst of two is no verdict
    assert verdict.passed and {test.verdict for test in verdict.tests} == {"too few to test"}
    passed, detail, lines = verdict_lines(verdict)
    assert "1 above ar's worst NLL/token 2.00" in detail and any(line.startswith("  to look at") for line in lines)
    assert not judge(replies + [scored(6, "chain", 4.1)]).passed  # past twice plain decoding's worst: alone
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


def test_a_reply_that_loops_longer_than_plain_decoding_is_listed_and_one_twelve_times_longer_fails_alone():
    def looped(index: int, method: str, loop: int, tokens: int = 64) -> ScoredReply:
        reply = scored(index, method, 0.5, tokens)
        return dataclasses.replace(reply, score=reply.score | {"longest_loop": loop})

    replies = [looped(0, "ar", 3), looped(1, "ar", 9), looped(2, "auto", 6), looped(3, "chain", 60)]
    verdict = judge(replies)
    assert verdict.above == []  # the looping reply's NLL is the lowest of all
    assert verdict.reference_loop == 9 and [reply.index for reply in verdict.looping] == [3]
    # The demo target gets stuck in loops by itself: one loop of 60 is to look at, not garbage
    assert verdict.passed and verdict.loop_guard == 12 * 9
    passed, detail, lines = verdict_lines(verdict)
    assert passed and "1 looping longer than ar's longest 9 tokens" in detail and "loop 60 of its 64 tokens" in lines[-1]
    catastrophe = judge(replies + [looped(4, "auto", 250, tokens=256)])
    assert not catastrophe.passed and [reply.index for reply in catastrophe.catastrophic] == [4]
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


# Simulated soaks laid out as the last ones: 500 replies, every second one `auto` and the
# others rotating over the rest, then 150 of plain decoding; 24 prompts in turn. Every method
# draws from one distribution per prompt: lognormal NLLs per token around the prompt's median
# (the demo target's medians range over prompts), geometric loops (mostly 0-3 tokens).
ROTATION = ["ar", "chain", "ngram", "tree", "eagle", "staged", "sprinter", "adaptive", "eagle-tree", "chain", "ngram", "tree"]
PROMPTS = 24


def simulated_soak(rng: random.Random, nll_shift: dict | None = None, long_loops: dict | None = None) -> list[ScoredReply]:
    """`nll_shift`: nats added to a method's NLLs; `long_loops`: the share of a method's replies that loop 20-60 tokens."""
    nll_shift, long_loops = nll_shift or {}, long_loops or {}
    prompt_medians = [math.exp(rng.gauss(0.0, 0.3)) for _ in range(PROMPTS)]
    replies = []
    for index in range(650):
        method = "ar" if index >= 500 else "auto" if index % 2 == 0 else ROTATION[(index // 2) % len(ROTATION)]
        nll = prompt_medians[index % PROMPTS] * math.exp(rng.gauss(0.0, 0.3)) + nll_shift.get(method, 0.0)
        looping = rng.random() < long_loops.get(method, 0.0)
        loop = rng.randint(20, 60) if looping else int(math.log(1.0 - rng.random()) / math.log(0.5))
        score = {"tokens": 64, "nll_per_token": nll, "longest_loop": loop, "cache_gaps": {"target": 0.0}, "cache_problem": None}
        replies.append(ScoredReply(index, method, f"prompt {index % PROMPTS}", "a", score))
    return replies


def test_a_sound_engine_fails_under_1_soak_in_100_where_the_issue_rule_fails_most():
    rng = random.Random(45)
    verdicts = [judge(simulated_soak(rng)) for _ in range(2000)]

    failed = sum(not verdict.passed for verdict in verdicts)
    # The issue's rule: any other reply above ar's worst NLL or looping longer than its longest
    issue_rule_failed = sum(bool(verdict.above or verdict.looping) for verdict in verdicts)
    assert failed < 20  # 1 of 2,000 with this seed; at most ~1 in 1,000 by construction
    assert issue_rule_failed > 1500  # 1,791 of 2,000: the worst of 500 tops the worst of 150 in 77% alone
    assert all(test.verdict != "too few to test" for test in verdicts[0].tests if test.method in ("auto", "chain", POOLED))


@pytest.mark.parametrize("broken", [{"long_loops": {"auto": 0.2}}, {"nll_shift": {"auto": 0.5}}])
def test_a_method_that_loops_long_a_fifth_of_the_time_or_scores_half_a_nat_worse_fails(broken):
    rng = random.Random(46)
    verdicts = [judge(simulated_soak(rng, **broken)) for _ in range(50)]

    assert sum(not verdict.passed for verdict in verdicts) >= 48  # 198 and 200 of 200 when measured
    assert all(not verdict.catastrophic for verdict in verdicts)  # the tests, not the guards, catch it
    assert sum(next(test for test in verdict.tests if test.method == "auto").verdict == "FAIL" for verdict in verdicts) >= 48


def test_one_catastrophic_reply_fails_a_soak_alone():
    sound = simulated_soak(random.Random(47))
    assert judge(sound).passed

    for catastrophe in ({"nll_per_token": 8.0}, {"tokens": 256, "longest_loop": 250}):
        replies = list(sound)
        replies[2] = dataclasses.replace(replies[2], score=replies[2].score | catastrophe)  # one `auto` reply
        verdict = judge(replies)
        assert not verdict.passed and [reply.index for reply in verdict.catastrophic] == [2]
        assert all(test.verdict == "pass" for test in verdict.tests)  # one reply in 250 moves no test
        assert "GARBAGE reply 3 (auto)" in "\n".join(verdict_lines(verdict)[2])


def test_a_method_with_few_replies_is_too_few_to_test_and_not_failed():
    replies = simulated_soak(random.Random(48))
    replies += [ScoredReply(650 + i, "new", "prompt 0", "a", replies[i].score | {"nll_per_token": 2.5}) for i in range(5)]
    verdict = judge(replies)

    new = next(test for test in verdict.tests if test.method == "new")
    assert new.verdict == "too few to test" and new.judged == 5 and verdict.passed
    assert any(line.split()[:2] == ["new", "5"] and line.endswith("too few to test") for line in verdict_lines(verdict)[2])


def test_a_stored_report_is_judged_again_with_each_reply_to_its_prompt():
    from app.soak_rejudge import stored_replies

    sound = simulated_soak(random.Random(49))
    report = {
        "replies": [{"index": reply.index, "method": reply.method, "score": reply.score} for reply in sound],
        "garbage": {"above": [{"index": 2, "text": "what it wrote"}], "looping": []},
    }
    replies = stored_replies(report, [f"question {i}" for i in range(PROMPTS)])

    assert [reply.prompt for reply in replies[:25]] == [f"question {i}" for i in range(PROMPTS)] + ["question 0"]
    assert replies[2].text == "what it wrote" and replies[3].text == ""
    assert judge(replies).tests == judge(sound).tests  # the same prompts together, under other names

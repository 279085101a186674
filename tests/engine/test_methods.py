"""The methods table: every row runs on a pair that offers it (exact rows give `ar`'s greedy
reply token for token, the approximate one says so), refusals name what is missing, and
`auto` picks the fastest of what it has measured, plain decoding included."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine import methods
from engine.chat_prompt import Message
from engine.config import DecodeSettings
from engine.drafters.auto import (
    EXPLORE_SHARE, LOSS_BUDGET, PLAIN_MARGIN, RECHECK_ROUNDS, SMOOTHING, TRIAL_ROUNDS, TRIAL_SHARE, VISIT_ROUNDS, MethodChooser,
    SpeedRecord,
)
from engine.drafters.base import NoDrafter
from engine import session
from engine.events import Finished, PromptProgress
from engine.config import ModelSpec, PairConfig
from engine.session import LoadedPair, method_refusal
from engine.tools.bench import ALL_METHODS, DEFAULT_ALIAS, parse_methods, resolve_default
from tests.engine.heads_fixtures import fixed_heads, tiny_draft_pair
from tests.engine.test_eagle import tiny_head


@pytest.fixture
def full_pair(make_word_tokenizer):
    """A tiny pair with a draft model, calibrated heads and an EAGLE-3 head: every method."""
    with_draft = tiny_draft_pair(make_word_tokenizer)
    head = tiny_head(3, layer_ids=(0, 1, 1))  # the tiny target has two layers
    pair = LoadedPair(
        PairConfig("tiny-full", ModelSpec("tiny"), ModelSpec("tiny-draft"), eagle="tiny-head"), with_draft.target, with_draft.draft, head,
    )
    pair.stop_token_ids = frozenset()
    pair.attach_heads(fixed_heads(passes=True))
    return pair


def reply(pair, method: str) -> Finished:
    events = list(pair.generate([Message("user", "w1 w2 w3 w4")], DecodeSettings(method=method, max_new_tokens=24)))
    return events[-1]


def test_every_row_runs_and_exact_rows_give_the_targets_own_reply(full_pair):
    assert set(full_pair.methods) == set(methods.NAMES)
    expected = reply(full_pair, "ar").token_ids
    for row in methods.TABLE:
        finished = reply(full_pair, row.name)
        assert finished.stats.exact == row.exact, row.name
        if row.exact:
            assert finished.token_ids == expected, row.name
        else:
            assert finished.stats.unchecked_tokens > 0, row.name  # heads that pass everything


def test_a_refusal_names_what_the_method_needs(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer)
    assert "eagle" not in pair.methods and "sprinter" not in pair.methods
    assert "needs an EAGLE-3 head" in method_refusal(pair, "eagle-tree")
    assert "tandem calibrate --pair tiny" in method_refusal(pair, "adaptive")
    assert "no such method" in method_refusal(pair, "fastest")
    assert method_refusal(pair, "auto") is None


def test_every_row_has_a_title_a_summary_and_known_needs():
    known = {methods.DRAFT_MODEL, methods.TREES, methods.HEADS, methods.EAGLE_HEAD}
    for row in methods.TABLE:
        assert row.title and row.summary and set(row.needs) <= known, row.name
    assert methods.default_method(("ar", "auto")) == "auto"
    assert methods.method_for_mode("tree", "sprinter") == "sprinter" and methods.method_for_mode("tree", "exact") == "tree"


# --- auto -------------------------------------------------------------------------------


def chooser(record: SpeedRecord) -> MethodChooser:
    return MethodChooser({"ar": NoDrafter(), "tree": NoDrafter(), "eagle": NoDrafter()}, record)


def run_rounds(auto: MethodChooser, rounds: int, seconds_per_token: dict[str, float], tokens: int | dict[str, int] = 2) -> list[str]:
    """What `observe` does after each round, with each candidate's cost given, and the tokens
    a round keeps (per candidate where a dict)."""
    chosen = []
    for _ in range(rounds):
        name = auto.current = auto._choose()
        chosen.append(name)
        kept = tokens[name] if isinstance(tokens, dict) else tokens
        auto._finish_round(seconds_per_token[name] * kept, kept, counted=True)
    return chosen


def finish_trials(auto: MethodChooser, seconds_per_token: dict[str, float], tokens: int | dict[str, int] = 2,
                  most_rounds: int = 100_000) -> list[str]:
    """Rounds until every candidate has been tried TRIAL_ROUNDS times (as paced by what trials
    cost); the candidates they ran."""
    chosen = []
    while any(auto.record.rounds.get(name, 0) < TRIAL_ROUNDS for name in auto.candidates):
        assert len(chosen) < most_rounds, "the trials never finished"
        chosen += run_rounds(auto, 1, seconds_per_token, tokens)
    return chosen


def time_share(chosen: list[str], name: str, cost: dict[str, float]) -> float:
    """Of the decoding time of the rounds `chosen`, the share that `name` ran."""
    return chosen.count(name) * cost[name] / sum(cost[each] for each in chosen)


def test_auto_tries_every_candidate_then_runs_the_fastest_and_now_and_then_each_other():
    auto = chooser(SpeedRecord())
    cost = {"ar": 0.010, "tree": 0.008, "eagle": 0.005}  # seconds per token
    kept = {"ar": 1, "tree": 2, "eagle": 2}  # plain decoding keeps one token a round
    tried = finish_trials(auto, cost, kept)
    assert tried[:TRIAL_ROUNDS] == ["ar"] * TRIAL_ROUNDS  # the reference first
    # both pay: the first trial waits for plain decoding to have earned it, the rest follow
    assert len(tried) < 200 and sorted(set(tried)) == ["ar", "eagle", "tree"]
    # (a trial's time counts as its candidate's exploring: its next visit waits for that share)
    chosen = run_rounds(auto, 5000, cost, kept)
    assert chosen.count("tree") >= 3 and chosen.count("ar") >= 2  # the runner-up and the third
    # each much slower one gets about EXPLORE_SHARE / 2 of the time, so both together about EXPLORE_SHARE
    assert time_share(chosen, "tree", cost) + time_share(chosen, "ar", cost) <= EXPLORE_SHARE * 1.5
    assert "eagle, 2.00× plain decoding's speed" in auto.explain()


def test_auto_explores_a_much_slower_runner_up_less_often_and_a_close_one_more():
    explored = {}
    for slowdown in (1.03, 1.2, 4.0):
        auto = chooser(SpeedRecord())
        cost = {"ar": 0.010, "tree": 0.010 * slowdown, "eagle": 0.010 * slowdown * 2}
        finish_trials(auto, cost)
        # long enough for the much slower ones' trials (their first share of time) to be paid for
        chosen = run_rounds(auto, 30_000, cost)
        explored[slowdown] = chosen.count("tree")
        assert 0 < chosen.count("eagle") < explored[slowdown]  # the third too, less often
        # What exploring cost against plain decoding alone: about LOSS_BUDGET, and where the
        # others are much slower at most EXPLORE_SHARE of the time (which costs about 3% there).
        lost = sum(chosen.count(name) * (cost[name] - cost["ar"]) for name in ("tree", "eagle")) / (len(chosen) * cost["ar"])
        assert lost <= max(LOSS_BUDGET, EXPLORE_SHARE * (slowdown - 1)) * 1.25
    assert explored[4.0] * 2 < explored[1.2] < explored[1.03] / 3  # a close call is checked often


def record_from_an_earlier_start(path, seconds_per_token: dict[str, float]) -> SpeedRecord:
    """A record as another process left it: 40 rounds of one token per candidate, saved, loaded."""
    earlier = SpeedRecord(path)
    for name, seconds in seconds_per_token.items():
        for _ in range(40):
            earlier.add(name, seconds, 1)
    earlier.save()
    return SpeedRecord.load(path)


def test_a_record_from_an_earlier_start_is_checked_before_it_is_trusted(tmp_path):
    # Saved when drafting paid (a busier host): tree 2x plain decoding. Now plain decoding is
    # the faster: the new process checks the record's fastest, its runner-up and plain
    # decoding first, and its own rounds replace the recorded averages.
    auto = chooser(record_from_an_earlier_start(tmp_path / "record.json", {"ar": 0.020, "tree": 0.010, "eagle": 0.030}))
    assert auto.explain() == "auto: checking what an earlier start measured as fastest here"
    now = {"ar": 0.010, "tree": 0.013, "eagle": 0.030}
    first = run_rounds(auto, 2 * RECHECK_ROUNDS, now, tokens=1)
    assert auto.explain() == "auto: plain decoding, since drafting does not pay on this machine"
    assert sorted(first) == ["ar"] * RECHECK_ROUNDS + ["tree"] * RECHECK_ROUNDS  # ar: both runner-up and plain
    later = run_rounds(auto, 2000, now, tokens=1)
    assert later.count("ar") > 0.8 * len(later) and time_share(later, "eagle", now) <= EXPLORE_SHARE


def test_a_runner_up_that_has_become_the_fastest_is_found_in_the_first_rounds(tmp_path):
    auto = chooser(record_from_an_earlier_start(tmp_path / "record.json", {"ar": 0.020, "tree": 0.010, "eagle": 0.012}))
    now = {"ar": 0.020, "tree": 0.010, "eagle": 0.007}
    first = run_rounds(auto, 3 * RECHECK_ROUNDS, now, tokens=1)
    assert sorted(set(first)) == ["ar", "eagle", "tree"]
    assert run_rounds(auto, 100, now, tokens=1).count("eagle") > 90


def test_a_third_candidate_whose_record_went_stale_is_found_again(tmp_path):
    # Recorded as the slowest (its rounds then caught up on long stretches, say); now the
    # fastest. Only a runner-up was ever retried before, so it stayed the slowest for good.
    auto = chooser(record_from_an_earlier_start(tmp_path / "record.json", {"ar": 0.010, "tree": 0.012, "eagle": 0.040}))
    now = {"ar": 0.010, "tree": 0.012, "eagle": 0.006}
    later = run_rounds(auto, 3000, now, tokens=1)
    assert later[-100:].count("eagle") > 90


def test_a_candidate_is_explored_once_its_share_pays_for_a_round():
    # Not at once: a process that explored every candidate as soon as it started lost 2-5% of
    # a short benchmark run to it.
    auto = chooser(SpeedRecord())
    cost = {"ar": 0.010, "tree": 0.020, "eagle": 0.030}
    finish_trials(auto, cost)
    assert run_rounds(auto, 20, cost) == ["ar"] * 20
    chosen = run_rounds(auto, 5000, cost)
    assert chosen.count("tree") >= 2 and chosen.count("eagle") >= 2


def test_exploring_is_paced_across_replies():
    # Each reply makes its own chooser over the pair's one record: the pacing lives there, so
    # a new reply does not start by exploring every candidate again.
    record = SpeedRecord()
    cost = {"ar": 0.010, "tree": 0.020, "eagle": 0.030}
    finish_trials(chooser(record), cost)
    chosen = []
    for _ in range(40):  # replies of 50 rounds
        chosen += run_rounds(chooser(record), 50, cost)
    assert time_share(chosen, "tree", cost) + time_share(chosen, "eagle", cost) <= EXPLORE_SHARE * 1.5


def test_an_exploring_visit_goes_on_until_a_round_counts():
    auto = chooser(SpeedRecord())
    cost = {"ar": 0.010, "tree": 0.012, "eagle": 0.020}
    finish_trials(auto, cost)
    while True:  # plain decoding until an exploring round comes due
        auto.current = auto._choose()
        if auto._exploring:
            break
        auto._finish_round(cost[auto.current], 1, counted=True)
    visited, rounds = auto.current, auto.record.rounds[auto.current]
    for _ in range(VISIT_ROUNDS - 1):  # its drafter caught up: not counted, and the visit goes on
        auto._finish_round(0.5, 1, counted=False)
        assert auto._choose() == visited and auto._exploring
    auto._finish_round(0.5, 1, counted=False)
    assert auto._choose() != visited  # VISIT_ROUNDS rounds: the visit ends even so
    assert auto.record.rounds[visited] == rounds


def test_a_new_candidates_first_rounds_are_averaged_alike():
    record = SpeedRecord()
    for seconds in (1.0, 4.0, 7.0):
        record.add("tree", seconds, 1)
    assert record.round_seconds["tree"] == pytest.approx(4.0)


def test_a_record_from_an_earlier_start_gives_way_to_this_ones_rounds(tmp_path):
    path = tmp_path / "record.json"
    record = record_from_an_earlier_start(path, {"tree": 10.0})
    record.add("tree", 4.0, 1)
    record.add("tree", 1.0, 1)
    assert record.round_seconds["tree"] == pytest.approx((4.0 + 1.0) / 2)
    for _ in range(round(1 / SMOOTHING)):  # then each round weighs SMOOTHING, as before
        record.add("tree", 1.0, 1)
    before = record.round_seconds["tree"]
    record.add("tree", 11.0, 1)
    assert record.round_seconds["tree"] == pytest.approx((1 - SMOOTHING) * before + SMOOTHING * 11.0)


def test_auto_falls_back_to_plain_decoding_where_drafting_does_not_pay():
    record = SpeedRecord()
    auto = chooser(record)
    for name, seconds in (("ar", 0.008), ("tree", 0.012), ("eagle", 0.020)):
        for _ in range(TRIAL_ROUNDS):
            record.add(name, seconds, 1)
    assert auto._choose() == "ar"
    assert auto.explain() == "auto: plain decoding, since drafting does not pay on this machine"


@pytest.mark.parametrize("faster, runs_it", [(PLAIN_MARGIN / 2, False), (PLAIN_MARGIN * 2, True)])
def test_auto_leaves_plain_decoding_only_for_a_method_clearly_faster(faster, runs_it):
    auto = chooser(SpeedRecord())
    cost = {"ar": 0.010, "tree": 0.010 / (1 + faster), "eagle": 0.030}
    finish_trials(auto, cost)
    chosen = run_rounds(auto, 500, cost)
    # mostly the one it runs; the other is checked often (a near tie, or a faster runner-up)
    assert (chosen.count("tree") > 0.6 * len(chosen)) == runs_it
    assert (chosen.count("ar") > 0.6 * len(chosen)) == (not runs_it)


def test_the_speed_record_survives_a_restart_and_a_damaged_one_starts_afresh(tmp_path):
    path = tmp_path / "record.json"
    record = SpeedRecord(path)
    for _ in range(16):
        record.spent(0.02, explored="tree")
        record.add("tree", 0.02, 3)
    reloaded = SpeedRecord.load(path)
    assert reloaded.rounds["tree"] == 16 and reloaded.seconds_per_token["tree"] == pytest.approx(0.02 / 3)
    assert reloaded.exploring_seconds == reloaded.decoding_seconds == pytest.approx(0.32)
    for _ in range(16):  # written every 16 rounds, but not twice within SAVE_INTERVAL_S
        record.add("tree", 0.02, 3)
    assert SpeedRecord.load(path).rounds["tree"] == 16
    path.write_text("{ damaged")
    assert SpeedRecord.load(path).rounds == {}
    # one whose averages do not fit together, or a round of no time, is no record either
    path.write_text('{"round_seconds": {"ar": 0.01}, "round_tokens": {}, "rounds": {"ar": 9}}')
    assert SpeedRecord.load(path).rounds == {}
    path.write_text('{"round_seconds": {"ar": 0.0}, "round_tokens": {"ar": 1.0}, "rounds": {"ar": 9}}')
    assert SpeedRecord.load(path).rounds == {}


def test_auto_replies_say_what_ran(full_pair):
    finished = reply(full_pair, "auto")
    assert sum(finished.stats.rounds_by_method.values()) > 0
    assert set(finished.stats.rounds_by_method) <= {"ar", *methods.AUTO_CANDIDATES}
    assert finished.stats.note.startswith("auto: ")


def test_the_bench_default_is_the_method_the_app_would_use(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer)
    assert parse_methods("ar,default", ALL_METHODS + (DEFAULT_ALIAS,)) == ["ar", "default"]
    assert resolve_default(["ar", "default"], pair) == ["ar", methods.default_method(pair.methods)] == ["ar", "auto"]
    assert resolve_default(["auto", "default"], pair) == ["auto"]


def test_every_verifier_the_settings_accept_is_a_rule_the_exact_verifier_knows():
    from engine.config import VERIFIERS
    from engine.verifying.exact import exact_verifier

    for rule in VERIFIERS:
        assert callable(exact_verifier(rule))
    with pytest.raises(ValueError, match="unknown chain rule"):
        exact_verifier("sprinter")


@pytest.mark.parametrize("fastest", ["ar", "tree"])
def test_auto_reads_a_long_prompt_only_into_the_models_its_next_round_drafts_with(full_pair, monkeypatch, fastest):
    # Where plain decoding is fastest, a draft model that read every long prompt cost each
    # reply ~1.2 s on an 1,800-token prompt for rounds that never came.
    monkeypatch.setattr(session, "PROMPT_PROGRESS_MIN_TOKENS", 8)  # the tiny pair's context is 160 tokens
    record = SpeedRecord()
    for name in ["ar", *methods.AUTO_CANDIDATES]:
        for _ in range(TRIAL_ROUNDS):
            record.add(name, 0.001 if name == fastest else 0.01, 1)
    full_pair.speed_record = record
    prompt = " ".join(["w1 w2 w3 w4"] * 10)
    events, draft_cached_when_read = [], None
    for event in full_pair.generate([Message("user", prompt)], DecodeSettings(method="auto", max_new_tokens=1)):
        events.append(event)
        if isinstance(event, PromptProgress) and event.tokens_done == event.tokens_total:
            draft_cached_when_read = len(full_pair.draft_runner.cached_ids)  # before any round ran
    read = [event for event in events if isinstance(event, PromptProgress)]
    assert read and read[-1].tokens_total > 40
    assert draft_cached_when_read == (0 if fastest == "ar" else read[-1].tokens_total)
    assert events[-1].stats.rounds_by_method == {fastest: 1}


class _Behind:
    """A candidate's model that has cached `cached` tokens."""

    def __init__(self, cached: int):
        self.cached = cached

    def __len__(self) -> int:
        return self.cached


class _DraftsWith(NoDrafter):
    def __init__(self, runtime):
        self.runtime = runtime

    @property
    def runtimes(self):
        return (self.runtime,)


def test_auto_does_not_take_a_round_that_read_a_long_stretch_for_its_candidates_speed():
    # A draft model that skipped a long prompt reads it in the first round it drafts; that
    # round's time is exploring, not the candidate's speed (an 1,800-token prompt: ~1.2 s).
    behind = _Behind(0)
    auto = MethodChooser({"ar": NoDrafter(), "tree": _DraftsWith(behind)}, SpeedRecord())
    auto.record.rounds["ar"] = TRIAL_ROUNDS
    auto.record.round_seconds["ar"], auto.record.round_tokens["ar"] = 0.01, 1.0
    auto.record.decoding_here = 10.0  # plain decoding ran long enough to pay for a trial
    context = list(range(500))
    for cached, counted in ((0, False), (len(context) - 1, True)):
        behind.cached = cached
        proposal = auto.propose(context, 100, None)
        assert auto.current == "tree"  # still on trial
        outcome = SimpleNamespace(draft_s=1.2 if not counted else 0.01, target_s=0.01, tokens=[7], target_tokens=1, proposal=proposal)
        auto.observe(outcome)
        assert auto.record.rounds.get("tree", 0) == (1 if counted else 0)
    assert auto.record.seconds_per_token["tree"] == pytest.approx(0.02)
    # the catching up was what trying cost: no trial again before plain decoding earns it back
    assert auto._choose() == "ar" and not auto._exploring
    assert auto.record.trial_loss_here == pytest.approx(1.21 - 0.01 + 0.02 - 0.01)


def test_trials_lose_at_most_their_share_where_drafting_does_not_pay():
    # A fresh start where nothing beats plain decoding (the demo pair on 2 cores): trying every
    # candidate first lost up to 18% of a short run of one kind of prompt.
    auto = chooser(SpeedRecord())
    cost = {"ar": 0.010, "tree": 0.013, "eagle": 0.020}
    kept = {"ar": 1, "tree": 2, "eagle": 2}
    decoding = lost = 0.0
    while any(auto.record.rounds.get(name, 0) < TRIAL_ROUNDS for name in cost):
        name = run_rounds(auto, 1, cost, kept)[0]
        decoding += cost[name] * kept[name]
        lost += (cost[name] - cost["ar"]) * kept[name]
        assert lost <= TRIAL_SHARE * decoding + max(cost[each] * kept[each] for each in cost)  # and the round under way
    assert decoding < 60  # every candidate was tried all the same


def test_auto_tries_trees_first_where_wide_verifies_are_cheap_and_chains_first_where_not():
    flat = {1: 0.010, 8: 0.011}.get  # a GPU: 8 tokens cost what one does
    steep = {1: 0.024, 8: 0.032}.get  # a 2-core CPU: 8 tokens cost a third more
    assert methods.trial_order(flat) == methods.AUTO_CANDIDATES
    assert methods.trial_order(lambda tokens: None) == methods.AUTO_CANDIDATES  # nothing measured
    order = methods.trial_order(steep)
    assert sorted(order) == sorted(methods.AUTO_CANDIDATES)
    assert order.index("chain") < order.index("tree") and order.index("chain") < order.index("staged")
    assert order.index("eagle") < order.index("eagle-tree")


@pytest.mark.parametrize("curve, first", [({1: 0.010, 2: 0.010, 8: 0.011}, "eagle-tree"), ({1: 0.024, 2: 0.025, 8: 0.032}, "eagle")])
def test_a_fresh_auto_first_tries_what_the_pairs_verify_costs_favour(full_pair, curve, first):
    full_pair.chain_length("chain", DecodeSettings().draft_tokens).seed(curve)
    full_pair.speed_record = SpeedRecord()
    for _ in range(TRIAL_ROUNDS):
        full_pair.speed_record.add("ar", 0.01, 1)
    chooser = methods.method("auto").drafter(full_pair, DecodeSettings())
    untried = [name for name in chooser.record.ranked(list(chooser.candidates)) if name != "ar"]
    assert untried[0] == first

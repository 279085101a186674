"""The methods table: every row runs on a pair that offers it (exact rows give `ar`'s greedy
reply token for token, the approximate one says so), refusals name what is missing, and
`auto` picks the fastest of what it has measured, plain decoding included."""
from __future__ import annotations

import pytest
import torch

from engine import methods
from engine.chat_prompt import Message
from engine.config import DecodeSettings
from engine.drafters.auto import EXPLORE_EVERY, TRIAL_ROUNDS, MethodChooser, SpeedRecord
from engine.drafters.base import NoDrafter
from engine.events import Finished
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


def test_auto_tries_every_candidate_then_runs_the_fastest_and_now_and_then_the_runner_up():
    record = SpeedRecord()
    auto = chooser(record)
    tried = []
    cost = {"ar": 0.010, "tree": 0.008, "eagle": 0.005}  # seconds per token
    for _ in range(TRIAL_ROUNDS * 3):
        name = auto._choose()
        tried.append(name)
        record.add(name, cost[name] * 2, 2)
        auto._rounds += 1
    assert sorted(set(tried)) == ["ar", "eagle", "tree"] and all(tried.count(name) == TRIAL_ROUNDS for name in cost)
    chosen = []
    for _ in range(EXPLORE_EVERY * 2):
        name = auto._choose()
        chosen.append(name)
        record.add(name, cost[name] * 2, 2)
        auto._rounds += 1
    assert chosen.count("eagle") == len(chosen) - 2 and chosen.count("tree") == 2  # one exploring round in 32
    assert "eagle, 2.00× plain decoding's speed" in auto.explain()


def test_auto_falls_back_to_plain_decoding_where_drafting_does_not_pay():
    record = SpeedRecord()
    auto = chooser(record)
    for name, seconds in (("ar", 0.008), ("tree", 0.012), ("eagle", 0.020)):
        for _ in range(TRIAL_ROUNDS):
            record.add(name, seconds, 1)
    assert auto._choose() == "ar"
    assert auto.explain() == "auto: plain decoding, since drafting does not pay on this machine"


def test_the_speed_record_survives_a_restart_and_a_damaged_one_starts_afresh(tmp_path):
    path = tmp_path / "record.json"
    record = SpeedRecord(path)
    for _ in range(16):
        record.add("tree", 0.02, 3)
    reloaded = SpeedRecord.load(path)
    assert reloaded.rounds["tree"] == 16 and reloaded.seconds_per_token["tree"] == pytest.approx(0.02 / 3)
    path.write_text("{ damaged")
    assert SpeedRecord.load(path).rounds == {}


def test_auto_replies_say_what_ran(full_pair):
    finished = reply(full_pair, "auto")
    assert sum(finished.stats.rounds_by_method.values()) > 0
    assert set(finished.stats.rounds_by_method) <= {"ar", "eagle-tree", "eagle", "tree", "staged"}
    assert finished.stats.note.startswith("auto: ")


def test_the_bench_default_is_the_method_the_app_would_use(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer)
    assert parse_methods("ar,default", ALL_METHODS + (DEFAULT_ALIAS,)) == ["ar", "default"]
    assert resolve_default(["ar", "default"], pair) == ["ar", methods.default_method(pair.methods)] == ["ar", "auto"]
    assert resolve_default(["auto", "default"], pair) == ["auto"]

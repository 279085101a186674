"""`tandem tune` and the runtime choice it saves: runtimes chosen by what speculation costs on
each (the verify curve), not by plain decoding speed; a saved choice is what "auto" loads."""
from __future__ import annotations

import dataclasses

import pytest

from engine.config import ConfigError, DecodeSettings, ModelSpec, PairConfig
from engine.errors import ModelLoadError
from engine.runtime_choice import RuntimeChoice, applies_to, choice_path, load_choice, save_choice, with_choice
from engine.session import load_pair
from engine.stats import GenerationStats
from engine.tools.bench import MethodResult, RunRecord
from engine.tools.costs import CostTable
from engine.tools.tune import Candidate, choose, predicted_tokens_per_s, tune
from tests.engine.tiny_models import tiny_gguf, tiny_llama

CHOICE = RuntimeChoice("torch", "fp32", "tree", 50.0, "2026-11-26", {"llama.cpp": 40.0, "torch fp32": 50.0})


def table(name: str, step_ms: float, verify8_ms: float) -> CostTable:
    return CostTable(device=name, source="made up for the test", verify_ms={1: step_ms, 8: verify8_ms},
                     prefill_ms_per_token=0.1, draft_call_ms={"draft": 1.0})


def result(method: str, call_tokens: list[int], tokens: int, seconds: float, model_seconds: float, draft_calls: int = 0) -> MethodResult:
    stats = GenerationStats(target_calls=len(call_tokens), target_call_tokens=call_tokens, draft_calls=draft_calls,
                            target_time_s=model_seconds)
    return MethodResult(method, [RunRecord(0, tuple(range(tokens)), seconds, stats)])


def test_a_reply_is_repriced_model_call_by_call_and_keeps_the_engines_own_time():
    # 10 one-token target calls that took 0.8 s of a 1 s reply: 0.2 s was the engine's own.
    plain = result("ar", [1] * 10, tokens=10, seconds=1.0, model_seconds=0.8)
    assert predicted_tokens_per_s(plain, table("x", 30.0, 60.0)) == pytest.approx(10 / (0.2 + 10 * 0.030))
    # A draft model's calls are priced by the table too: their measured time is replaced, not added.
    drafted = result("chain", [8] * 4, tokens=12, seconds=1.0, model_seconds=0.5, draft_calls=16)
    drafted.runs[0].stats.draft_time_s = 0.1
    assert predicted_tokens_per_s(drafted, table("x", 30.0, 60.0)) == pytest.approx(12 / (0.4 + 4 * 0.060 + 16 * 0.001))


def test_the_runtime_with_the_cheaper_verify_wins_even_with_a_slower_step():
    replies = {
        "ar": result("ar", [1] * 30, tokens=30, seconds=0.40, model_seconds=0.30),
        "tree": result("tree", [8] * 10, tokens=30, seconds=0.50, model_seconds=0.40, draft_calls=30),
    }
    steep = Candidate("llama.cpp", "auto")  # the faster step, but 8 tokens cost 3.5 steps
    flat = Candidate("torch", "auto")  # a slower step, 8 tokens for 1.2 steps
    tables = {steep: table("steep", 10.0, 35.0), flat: table("flat", 12.0, 14.4)}
    best, method, predicted = choose(replies, tables)
    assert predicted["llama.cpp"]["ar"] > predicted["torch"]["ar"]  # plain decoding alone would pick llama.cpp
    assert (best, method) == (flat, "tree")
    assert predicted["torch"]["tree"] > predicted["llama.cpp"]["ar"]
    # The same replies, where verifying costs as much everywhere: the cheaper step wins.
    tables[flat] = table("steep too", 12.0, 42.0)
    assert choose(replies, tables)[:2] == (steep, "ar")


def test_a_choice_is_kept_per_pair_and_machine_whatever_runtime_the_pair_asks_for():
    pair = PairConfig("mine", ModelSpec("some/target"), ModelSpec("some/draft"))
    assert load_choice(pair) is None
    save_choice(pair, CHOICE)
    assert load_choice(pair) == CHOICE
    # The key is the pair's models, not what the choice decides, nor its name.
    assert load_choice(dataclasses.replace(pair, runtime="torch", name="renamed", compile=False)) == CHOICE
    assert load_choice(dataclasses.replace(pair, target=ModelSpec("some/target", precision="bf16"))) == CHOICE
    assert load_choice(dataclasses.replace(pair, target=ModelSpec("other/target"))) is None
    assert load_choice(dataclasses.replace(pair, draft=None)) is None
    # ...and it decides only what the user left to auto.
    assert applies_to(pair)
    assert not applies_to(dataclasses.replace(pair, runtime="llama.cpp"))
    assert not applies_to(dataclasses.replace(pair, target=ModelSpec("some/target", precision="bf16")))
    chosen = with_choice(pair, CHOICE)
    assert (chosen.runtime, chosen.target.precision, chosen.draft) == ("torch", "fp32", pair.draft)
    # A damaged cache file is no choice, not an error.
    choice_path(pair).write_text("{not json", encoding="utf-8")
    assert load_choice(pair) is None


def test_candidates_parse_and_bad_ones_are_refused():
    assert Candidate.parse("torch:bf16") == Candidate("torch", "bf16")
    assert Candidate.parse(" llama.cpp ").label == "llama.cpp"
    for bad in ("vulkan", "auto", "torch:int4"):
        with pytest.raises(ConfigError):
            Candidate.parse(bad)


@pytest.fixture
def two_runtime_pair(tmp_path) -> PairConfig:
    """A tiny random Llama as a folder with a GGUF export beside it: both runtimes can run it."""
    pytest.importorskip("llama_cpp")
    folder = tmp_path / "target"
    tiny_gguf(tiny_llama(seed=4, vocab_size=64), folder)
    return PairConfig("tiny", ModelSpec(str(folder)), None)


def test_tune_measures_each_runtime_saves_the_fastest_and_auto_then_loads_it(two_runtime_pair):
    config = two_runtime_pair
    plain = load_pair(config)
    assert plain.target.runtime == "llama.cpp" and plain.runtime_choice is None  # the unmeasured default
    plain.close()
    candidates = [Candidate("llama.cpp", "auto"), Candidate("torch", "fp32"), Candidate("torch", "bf16")]
    loaded = []

    def load(candidate_config: PairConfig):
        loaded.append((candidate_config.runtime, candidate_config.target.precision))
        if candidate_config.target.precision == "bf16":
            raise ModelLoadError("Not enough memory for the target in bf16.")  # a candidate this machine cannot run
        return load_pair(candidate_config)

    report = tune(config, candidates, ["ab ce", "da bb"], DecodeSettings(max_new_tokens=6), load, progress=lambda line: None)
    assert loaded == [("llama.cpp", "auto"), ("torch", "fp32"), ("torch", "bf16")]
    assert set(report["cost_tables"]) == {"llama.cpp", "torch fp32"}
    assert report["skipped"] == {"torch bf16": "Not enough memory for the target in bf16."}
    # The replies were written once, on the first candidate, with every exact method the pair offers.
    assert report["replies_measured_on"] == "llama.cpp" and "ar" in report["measured_tokens_per_s"]
    assert set(report["predicted_tokens_per_s"]["torch fp32"]) == set(report["measured_tokens_per_s"])
    predicted = report["predicted_tokens_per_s"]
    best = max(predicted, key=lambda label: max(predicted[label].values()))
    chosen = report["chosen"]
    assert (chosen["runtime"], chosen["precision"]) == {"llama.cpp": ("llama.cpp", "auto"), "torch fp32": ("torch", "fp32")}[best]
    assert chosen["tokens_per_s"] == max(predicted[best].values())

    saved = load_choice(config)
    assert saved is not None and saved.runtime == chosen["runtime"]
    # Force the other runtime, as a measurement on another machine might: auto follows it.
    save_choice(config, dataclasses.replace(saved, runtime="torch", precision="fp32"))
    pair = load_pair(config)
    try:
        assert (pair.target.runtime.split(" ")[0], pair.target.precision) == ("torch", "fp32")
        assert pair.config == config  # what gets saved stays the user's auto
        assert "chosen by tandem tune" in pair.describe()["runtime_choice"]
    finally:
        pair.close()
    # A pair that fixes its runtime ignores the choice.
    fixed = load_pair(dataclasses.replace(config, runtime="llama.cpp"))
    assert fixed.target.runtime == "llama.cpp" and fixed.runtime_choice is None
    fixed.close()

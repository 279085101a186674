"""`tandem tune` and the runtime choice it saves: runtimes chosen by what speculation costs on
each (the verify curve), not by plain decoding speed; a saved choice is what "auto" loads."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from gguf import LlamaFileType

from engine.config import ConfigError, DecodeSettings, ModelSpec, PairConfig
from engine.errors import ModelLoadError
from engine.runtime_choice import RuntimeChoice, applies_to, choice_path, load_choice, placement, save_choice
from engine.session import load_pair
from engine.stats import GenerationStats
from engine.tools.bench import MethodResult, RunRecord
from engine.tools.costs import CostTable
from engine.models import resolve_precision
from engine.tools.tune import Candidate, choose, default_candidates, format_report, predicted_tokens_per_s, tune
from tests.engine.discovery.fake_machine import write_gguf
from tests.engine.tiny_models import tiny_gguf, tiny_llama

CHOICE = RuntimeChoice("torch", "fp32", "tree", 50.0, "2026-11-26", {"llama.cpp": 40.0, "torch fp32": 50.0})


def table(name: str, step_ms: float, verify8_ms: float) -> CostTable:
    return CostTable(device=name, source="made up for the test", verify_ms={1: step_ms, 8: verify8_ms},
                     prefill_ms_per_token=step_ms / 20, draft_call_ms={"draft": 1.0})


def result(method: str, call_tokens: list[int], tokens: int, seconds: float, model_seconds: float, draft_calls: int = 0) -> MethodResult:
    stats = GenerationStats(target_calls=len(call_tokens), target_call_tokens=call_tokens, draft_calls=draft_calls,
                            target_time_s=model_seconds)
    return MethodResult(method, [RunRecord(0, tuple(range(tokens)), seconds, stats)])


def test_a_reply_is_repriced_model_call_by_call_and_keeps_what_the_tables_do_not_price():
    # 10 one-token target calls, 0.3 s at the prices of the runtime that wrote the reply, in a
    # reply of 0.5 s: 0.2 s went to what no table prices (Python, sampling, accepting).
    written_on, cheaper = table("here", 30.0, 60.0), table("there", 15.0, 30.0)
    plain = result("ar", [1] * 10, tokens=10, seconds=0.5, model_seconds=0.3)
    assert predicted_tokens_per_s(plain, written_on, written_on) == pytest.approx(10 / 0.5)  # its measured speed
    assert predicted_tokens_per_s(plain, written_on, cheaper) == pytest.approx(10 / (0.2 + 10 * 0.015))
    # A draft model's calls are re-priced too (chain's row needs no draft model, but it drafts with the pair's).
    # The first call reads a 20-token prompt: priced as prompt reading (0.1 ms a token), not as a verify.
    drafted = result("chain", [20] + [8] * 4, tokens=12, seconds=0.5, model_seconds=0.3, draft_calls=16)
    here_s = 0.030 + 4 * 0.060 + 16 * 0.001
    there_s = 0.015 + 4 * 0.030 + 16 * 0.001
    assert predicted_tokens_per_s(drafted, written_on, cheaper) == pytest.approx(12 / (0.5 - here_s + there_s))


def test_the_runtime_with_the_cheaper_verify_wins_even_with_a_slower_step():
    replies = {
        "ar": result("ar", [1] * 30, tokens=30, seconds=0.35, model_seconds=0.30),
        "tree": result("tree", [8] * 10, tokens=30, seconds=0.45, model_seconds=0.40, draft_calls=30),
    }
    steep = Candidate("llama.cpp", "auto")  # the faster step, but 8 tokens cost 3.5 steps
    flat = Candidate("torch", "auto")  # a slower step, 8 tokens for 1.2 steps
    tables = {steep: table("steep", 10.0, 35.0), flat: table("flat", 12.0, 14.4)}
    best, method, predicted = choose(replies, tables[steep], tables)
    assert predicted["llama.cpp"]["ar"] > predicted["torch"]["ar"]  # plain decoding alone would pick llama.cpp
    assert (best, method) == (flat, "tree")
    assert predicted["torch"]["tree"] > predicted["llama.cpp"]["ar"]
    # The same replies, where verifying costs as much everywhere: the cheaper step wins.
    tables[flat] = table("steep too", 12.0, 42.0)
    assert choose(replies, tables[steep], tables)[:2] == (steep, "ar")


def test_a_choice_measured_compiled_does_not_hold_where_torch_may_not_compile(monkeypatch):
    pair = PairConfig("mine", ModelSpec("some/target"), None)
    monkeypatch.setenv("TANDEM_COMPILE", "1")
    save_choice(pair, CHOICE)
    assert load_choice(pair) == CHOICE
    assert load_choice(dataclasses.replace(pair, compile=False)) is None
    monkeypatch.setenv("TANDEM_COMPILE", "0")
    assert load_choice(pair) is None


def test_a_choice_is_kept_per_pair_and_machine_whatever_runtime_the_pair_asks_for():
    pair = PairConfig("mine", ModelSpec("some/target"), ModelSpec("some/draft"))
    assert load_choice(pair) is None
    save_choice(pair, CHOICE)
    assert load_choice(pair) == CHOICE
    # The key is the pair's models, not what the choice decides, nor its name.
    assert load_choice(dataclasses.replace(pair, runtime="torch", name="renamed")) == CHOICE
    assert load_choice(dataclasses.replace(pair, target=ModelSpec("some/target", precision="bf16"))) == CHOICE
    assert load_choice(dataclasses.replace(pair, target=ModelSpec("other/target"))) is None
    assert load_choice(dataclasses.replace(pair, draft=None)) is None
    # ...and it decides only what the user left to auto.
    assert applies_to(pair)
    assert not applies_to(dataclasses.replace(pair, runtime="llama.cpp"))
    assert not applies_to(dataclasses.replace(pair, target=ModelSpec("some/target", precision="bf16")))
    placed = placement(pair, CHOICE)  # torch runs any draft: the draft follows the target
    assert (placed.target.precision, placed.target_runtime, placed.draft_runtime) == ("fp32", "torch", "torch")
    assert placement(pair, None).target == pair.target
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
    """A tiny random Llama target as a folder with a GGUF export beside it (both runtimes can
    run it), and a draft without one (only torch can)."""
    pytest.importorskip("llama_cpp")
    target, draft = tmp_path / "target", tmp_path / "draft"
    tiny_gguf(tiny_llama(seed=4, vocab_size=64), target)
    tiny_gguf(tiny_llama(seed=5, vocab_size=64, layers=1), draft)
    for exported in draft.glob("*.gguf"):
        exported.unlink()
    return PairConfig("tiny", ModelSpec(str(target)), ModelSpec(str(draft)))


def test_tune_measures_each_runtime_saves_the_fastest_and_auto_then_loads_it(two_runtime_pair):
    config = two_runtime_pair
    plain = load_pair(config)
    assert (plain.target.runtime, plain.draft.runtime.split(" ")[0]) == ("llama.cpp", "torch")  # the unmeasured default
    assert plain.runtime_choice is None
    plain.close()
    candidates = [Candidate("llama.cpp", "auto"), Candidate("torch", "fp32"), Candidate("torch", "bf16")]
    loaded = []

    def load(pair_config: PairConfig, choice: RuntimeChoice):
        if choice.precision == "bf16":
            raise ModelLoadError("Not enough memory for the target in bf16.")  # a candidate this machine cannot run
        pair = load_pair(pair_config, choice=choice)
        loaded.append((pair.target.runtime.split(" ")[0], pair.target.precision, pair.draft.runtime.split(" ")[0]))
        return pair

    report = tune(config, candidates, ["ab ce", "da bb"], DecodeSettings(max_new_tokens=6), load, progress=lambda line: None)
    # llama.cpp: the draft, which has no GGUF file, stays on torch as auto would place it.
    assert loaded == [("llama.cpp", "Q8_0", "torch"), ("torch", "fp32", "torch")]
    assert set(report["cost_tables"]) == {"llama.cpp", "torch fp32"}
    assert report["skipped"] == {"torch bf16": "Not enough memory for the target in bf16."}
    # each torch candidate's forward plan, as its target loaded (llama.cpp has none)
    assert list(report["forward_plans"]) == ["torch fp32"] and "precision fp32 (the pair's setting)" in report["forward_plans"]["torch fp32"]
    assert f"forward plan: {report['forward_plans']['torch fp32']}" in format_report(report)
    # The replies were written once, on the first candidate, with every exact method the pair
    # offers; re-priced with that candidate's own table they come back at their measured speed.
    assert report["replies_measured_on"] == "llama.cpp"
    assert {"ar", "chain", "tree"} <= set(report["measured_tokens_per_s"])
    for method, measured in report["measured_tokens_per_s"].items():
        assert report["predicted_tokens_per_s"]["llama.cpp"][method] == pytest.approx(measured, rel=1e-6)
    # The other runtime wrote the replies again with the method predicted fastest on it, and
    # the choice is whichever measured faster, not whichever was predicted faster.
    predicted, confirmed = report["predicted_tokens_per_s"], report["confirmed"]
    torch_best = max(predicted["torch fp32"], key=predicted["torch fp32"].__getitem__)
    assert confirmed["torch fp32"]["method"] == torch_best and confirmed["torch fp32"]["tokens_per_s"] > 0
    measured = report["measured_tokens_per_s"]
    assert confirmed["llama.cpp"] == {"method": max(measured, key=measured.__getitem__), "tokens_per_s": max(measured.values())}
    best = max(confirmed, key=lambda label: confirmed[label]["tokens_per_s"])
    chosen = report["chosen"]
    assert (chosen["runtime"], chosen["precision"]) == {"llama.cpp": ("llama.cpp", "auto"), "torch fp32": ("torch", "fp32")}[best]
    assert chosen["tokens_per_s"] == confirmed[best]["tokens_per_s"]

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
    fixed = load_pair(dataclasses.replace(config, runtime="llama.cpp", draft=None))
    assert fixed.target.runtime == "llama.cpp" and fixed.runtime_choice is None
    fixed.close()


def test_a_choice_that_no_longer_loads_is_dropped_and_the_pair_loads_as_auto(two_runtime_pair):
    config = dataclasses.replace(two_runtime_pair, draft=None)
    save_choice(config, dataclasses.replace(CHOICE, runtime="llama.cpp", precision="auto"))
    for exported in Path(config.target.source).glob("*.gguf"):
        exported.unlink()  # the GGUF export the choice ran on is gone
    messages = []
    pair = load_pair(config, lambda message, fraction: messages.append(message))
    try:
        assert pair.target.runtime.startswith("torch") and pair.runtime_choice is None
        assert any("tandem tune chose (llama.cpp) no longer loads" in message for message in messages)
        assert load_choice(config) is None  # measured again next time, not tried again
    finally:
        pair.close()


def test_the_demo_pair_falls_back_to_its_own_runtime_when_torch_fails_it(demo_target_path, monkeypatch):
    pytest.importorskip("llama_cpp")
    from engine import runtime_choice, session
    from engine.pairs import find_pair

    demo = dataclasses.replace(find_pair("demo"), draft=None)
    monkeypatch.setattr(runtime_choice, "measured_here", lambda: True)
    real_load_model = session.load_model

    def torch_fails(spec, progress=None, runtime="auto", **options):
        if runtime == "torch":
            raise ModelLoadError("No space left on device while converting the demo model.")
        return real_load_model(spec, progress, runtime=runtime, **options)

    monkeypatch.setattr(session, "load_model", torch_fails)
    messages = []
    pair = load_pair(demo, lambda message, fraction: messages.append(message))
    try:
        assert pair.target.runtime == "llama.cpp" and pair.runtime_choice is None
        assert any("did not load on torch (No space left on device" in message for message in messages)
    finally:
        pair.close()


def test_a_pair_whose_draft_fails_to_load_does_not_keep_its_target(two_runtime_pair, monkeypatch):
    from engine import session
    from engine.errors import IncompatiblePairError
    from engine.models import LoadedModel

    closed = []
    close = LoadedModel.close
    monkeypatch.setattr(LoadedModel, "close", lambda self: closed.append(self.label) or close(self))

    def refuse(target_tokenizer, draft_tokenizer):
        raise IncompatiblePairError("the tokenizers differ")

    monkeypatch.setattr(session, "check_pair_compatible", refuse)
    with pytest.raises(IncompatiblePairError):
        load_pair(two_runtime_pair)
    assert len(closed) == 2  # the draft and the target


def test_the_demo_pair_loads_on_torch_before_any_measurement_where_the_native_forward_was_measured(monkeypatch):
    from engine import runtime_choice
    from engine.pairs import find_pair

    demo = find_pair("demo")
    monkeypatch.setattr(runtime_choice, "measured_here", lambda: True)
    placed = placement(demo, None)
    assert (placed.target, placed.target_runtime, placed.draft_runtime) == (demo.target, "torch", "torch")
    # not where the CPU's kernel build was never measured, nor where the user chose, nor for other targets
    monkeypatch.setattr(runtime_choice, "measured_here", lambda: False)
    assert placement(demo, None).target_runtime == demo.runtime == "auto"
    monkeypatch.setattr(runtime_choice, "measured_here", lambda: True)
    assert placement(dataclasses.replace(demo, runtime="llama.cpp"), None).target_runtime == "llama.cpp"
    other = dataclasses.replace(demo, target=ModelSpec("/models/some.gguf"))
    assert placement(other, None).target_runtime == "auto"


@pytest.mark.parametrize("file_type, offered", [(LlamaFileType.MOSTLY_Q4_K_M, True), (LlamaFileType.MOSTLY_Q8_0, False)])
def test_a_gguf_target_below_8_bits_is_also_measured_as_it_is_stored(tmp_path, file_type, offered):
    pytest.importorskip("llama_cpp")
    target = write_gguf(tmp_path / "model.gguf", file_type=file_type)
    labels = [candidate.label for candidate in default_candidates(PairConfig("p", ModelSpec(str(target))))]
    assert ("llama.cpp stored" in labels) == offered
    assert labels[0] == "llama.cpp" and "torch" in labels


def test_stored_precision_is_refused_clearly_where_torch_runs_the_model():
    with pytest.raises(ModelLoadError, match="runs a GGUF file as it is, on the llama.cpp runtime"):
        resolve_precision("stored", torch.device("cpu"))
    assert Candidate.parse("llama.cpp:stored") == Candidate("llama.cpp", "stored")

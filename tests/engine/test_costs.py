"""Cost tables: what a call costs on a device, recorded on this machine, and a bench run re-timed
with another device's table."""
from __future__ import annotations

import json

import pytest

from engine.config import ConfigError, DecodeSettings
from engine.stats import GenerationStats
from engine.tools.bench import Bench, format_table
from engine.tools.costs import CostTable, drafter_of, measure_costs
from tests.engine.heads_fixtures import tiny_draft_pair

TABLE = CostTable(
    device="Test GPU", source="made up for the test",
    verify_ms={1: 2.0, 2: 2.2, 4: 2.4, 8: 3.0, 64: 6.0}, prefill_ms_per_token=0.05, draft_call_ms={"draft": 0.5, "eagle": 0.25},
)


def test_a_forward_costs_what_the_table_says_between_and_past_its_sizes():
    assert TABLE.verify_cost_ms(4) == 2.4
    assert TABLE.verify_cost_ms(6) == pytest.approx(2.7)  # halfway between 4 and 8
    assert TABLE.verify_cost_ms(300) == pytest.approx(15.0)  # a prompt: 300 tokens at 0.05 ms
    assert TABLE.verify_cost_ms(65) == 6.0  # never cheaper than the largest measured forward


def test_a_reply_is_retimed_call_by_call():
    stats = GenerationStats(target_calls=3, draft_calls=10, target_call_tokens=[40, 5, 1])
    expected_ms = 40 * 0.05 + TABLE.verify_cost_ms(5) + 2.0 + 10 * 0.5  # the first call reads the prompt
    assert TABLE.reply_seconds(stats, "draft") == pytest.approx(expected_ms / 1000)
    assert TABLE.reply_seconds(stats, None) == pytest.approx((expected_ms - 5.0) / 1000)  # n-grams draft for free
    # chain drafts with the pair's draft model (its row needs none: without one it looks up n-grams)
    assert [drafter_of(name) for name in ("chain", "tree", "eagle-tree", "hf-assisted")] == ["draft", "draft", "eagle", None]
    # Plain decoding and n-grams make no draft calls, so no entry prices anything for them.
    plain = GenerationStats(target_calls=2, target_call_tokens=[40, 1])
    assert TABLE.reply_seconds(plain, drafter_of("ar")) == TABLE.reply_seconds(plain, drafter_of("ngram")) == pytest.approx((40 * 0.05 + 2.0) / 1000)


def test_a_table_round_trips_and_a_bad_file_is_a_clear_error(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps(TABLE.to_dict()))
    assert CostTable.load(path) == TABLE
    path.write_text('{"device": "x"}')
    with pytest.raises(ConfigError, match="not a cost table"):
        CostTable.load(path)
    with pytest.raises(ConfigError, match="cannot read the cost table"):
        CostTable.load(tmp_path / "missing.json")


def test_recorded_costs_and_predictions_for_another_device(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer)
    recorded = measure_costs(pair, "this CPU")
    assert set(recorded.verify_ms) >= {1, 8, 64} and all(ms > 0 for ms in recorded.verify_ms.values())
    assert recorded.draft_call_ms["draft"] > 0 and recorded.prefill_ms_per_token > 0
    assert len(pair.target_runner) == 0  # nothing left cached
    report = Bench(pair, DecodeSettings(max_new_tokens=12), TABLE).run(["w1 w2 w3"], ["ar", "chain"], progress=lambda line: None)
    rows = {row["method"]: row for row in report["results"]}
    ar, chain = rows["ar"], rows["chain"]
    # ar: one call per token, each a 1-token forward but the first (the prompt).
    assert ar["predicted_tokens_per_s"] > 0 and ar["predicted_speedup_vs_ar"] == pytest.approx(1.0)
    assert chain["predicted_tokens_per_s"] > 0
    assert "pred Test GPU" in format_table(report) and "re-timed with the cost table of Test GPU" in format_table(report)


def test_a_llamacpp_target_offloaded_to_a_gpu_is_reported_on_it(monkeypatch):
    """The report names the GPU that llama.cpp offloads to, though torch's device is the CPU
    (the cost table recorded there is that GPU's, not the processor's)."""
    import types

    import torch

    from engine.tools.bench import machine_description

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    target = types.SimpleNamespace(device=torch.device("cpu"), gpu_layers=-1, model=None)
    assert machine_description(types.SimpleNamespace(target=target))["gpu"] == "llama.cpp's GPU"
    target.gpu_layers = 0
    assert "gpu" not in machine_description(types.SimpleNamespace(target=target))

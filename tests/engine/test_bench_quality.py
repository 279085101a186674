"""`tandem bench` scores every output with the target after timing: an approximate method's
quality is reported beside its speed."""
import pytest

from engine.bench import Bench, format_table
from engine.config import DecodeSettings
from tests.engine.heads_fixtures import fixed_heads, tiny_draft_pair

PROMPTS = ["w1 w2 w3", "w4 w5 w6 w7"]


def test_bench_reports_nll_and_rouge_against_ar(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer, noise=1.0)
    pair.attach_heads(fixed_heads(passes=True))  # SPRINTER then writes the draft's text
    report = Bench(pair, DecodeSettings(max_new_tokens=24)).run(PROMPTS, ["ar", "chain", "sprinter"], progress=lambda line: None)
    rows = {row["method"]: row for row in report["results"]}
    assert rows["ar"]["rouge_l_vs_ar"] == 1.0 and rows["chain"]["rouge_l_vs_ar"] == 1.0  # greedy chain is exact
    assert rows["sprinter"]["rouge_l_vs_ar"] < 1.0 and not rows["sprinter"]["exact"]
    assert rows["sprinter"]["unchecked_share"] == 1.0 and rows["sprinter"]["target_calls_skipped"] > 0
    assert rows["chain"]["target_nll"] == pytest.approx(rows["ar"]["target_nll"], rel=1e-4)
    # The draft's text is less likely under the target than the target's own greedy text.
    assert rows["sprinter"]["target_nll"] > rows["ar"]["target_nll"]
    assert [run["tokens"] for run in rows["ar"]["per_prompt"]] == [24, 24]
    table = format_table(report)
    assert "nll" in table and "rougeL" in table and "APPROXIMATE" in table.splitlines()[-1]

"""`tandem bench` scores every output with the target after timing: an approximate method's
quality is reported beside its speed."""
import pytest

from engine.tools.bench import Bench, available_methods, format_table
from engine.config import ConfigError, DecodeSettings
from tests.engine.heads_fixtures import fixed_heads, tiny_draft_pair

PROMPTS = ["w1 w2 w3", "w4 w5 w6 w7"]


def quiet(line: str) -> None:
    pass


def test_bench_reports_nll_and_rouge_against_ar(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer, noise=1.0)
    pair.attach_heads(fixed_heads(passes=True))  # SPRINTER then writes the draft's text
    report = Bench(pair, DecodeSettings(max_new_tokens=24)).run(PROMPTS, ["ar", "chain", "sprinter"], progress=quiet)
    rows = {row["method"]: row for row in report["results"]}
    assert rows["ar"]["rouge_l_vs_ar"] == 1.0 and rows["chain"]["rouge_l_vs_ar"] == 1.0  # greedy chain is exact
    assert rows["sprinter"]["rouge_l_vs_ar"] < 1.0 and not rows["sprinter"]["exact"]
    assert rows["ar"]["exact"] and rows["chain"]["exact"]
    assert rows["sprinter"]["unchecked_share"] == 1.0 and rows["sprinter"]["target_calls_skipped"] > 0
    assert rows["ar"]["unchecked_share"] == 0.0 and rows["chain"]["target_calls_skipped"] == 0
    assert rows["chain"]["target_nll"] == pytest.approx(rows["ar"]["target_nll"], rel=1e-4)
    # The draft's text is less likely under the target than the target's own greedy text.
    assert rows["sprinter"]["target_nll"] > rows["ar"]["target_nll"]
    assert [run["tokens"] for run in rows["ar"]["per_prompt"]] == [24, 24]
    assert len(pair.target_runner) == 0  # the scoring forwards leave nothing cached
    table = format_table(report)
    sprinter_line = next(line for line in table.splitlines() if line.startswith("sprinter "))
    assert "nll" in table and "rougeL" in table and sprinter_line.endswith("APPROXIMATE, 100% unchecked")
    assert "nll: the target's mean negative log-likelihood" in table  # the legend says what the columns mean


def test_without_ar_there_is_no_rouge_but_still_an_nll(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer)
    report = Bench(pair, DecodeSettings(max_new_tokens=6)).run(PROMPTS[:1], ["chain"], progress=quiet)
    row = report["results"][0]
    assert row["rouge_l_vs_ar"] is None and row["target_nll"] > 0


def test_head_methods_need_calibrated_heads(make_word_tokenizer):
    pair = tiny_draft_pair(make_word_tokenizer)
    assert "adaptive" not in available_methods(pair) and "sprinter" not in available_methods(pair)
    with pytest.raises(ConfigError, match=r"cannot decode with 'sprinter'.*tandem calibrate --pair tiny.* It offers auto, ar, chain"):
        Bench(pair, DecodeSettings(max_new_tokens=4)).run(PROMPTS, ["ar", "sprinter"], progress=quiet)
    pair.attach_heads(fixed_heads(passes=False))
    assert {"adaptive", "sprinter"} <= set(available_methods(pair))  # what --methods all runs


def row(method: str, **quality) -> dict:
    """A report row as MethodResult.summary writes it, with the figures the table shows."""
    figures = dict.fromkeys(
        ["speedup_vs_ar", "acceptance_rate", "mean_accepted_per_target_call", "target_calls_per_token",
         "draft_calls_per_target_call", "draft_stage_acceptance", "exact_match_vs_ar", "target_nll",
         "rouge_l_vs_ar", "unchecked_share"]
    )
    return figures | {"method": method, "tokens_per_s": 10.0, "peak_rss_mb": 100.0, "exact": True} | quality


def test_table_shows_nll_rouge_and_marks_approximate_rows():
    report = {"results": [
        row("ar", target_nll=1.23456, rouge_l_vs_ar=1.0, unchecked_share=0.0),
        row("sprinter", target_nll=2.5, rouge_l_vs_ar=0.625, exact=False, unchecked_share=0.25),
        row("hf-assisted"),  # a peer whose figures are missing shows dashes
    ]}
    header, _, ar, sprinter, peer = format_table(report).splitlines()[:5]
    assert header.split()[-5:] == ["exact", "nll", "rougeL", "peak", "MB"]
    assert ar.split()[-3:] == ["1.235", "1.000", "100"]
    assert sprinter.endswith("2.500  0.625      100  APPROXIMATE, 25% unchecked")
    assert peer.split()[-3:] == ["—", "—", "100"] and "APPROXIMATE" not in peer

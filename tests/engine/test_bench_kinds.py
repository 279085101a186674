"""Prompts by kind of task: the shipped task-kinds set, --prompts by name, and the bench's
report by kind (engine/prompts.py, engine/tools/bench.py)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from engine.config import ConfigError
from engine.prompts import CHAT_PROMPTS, TASK_KIND_PROMPTS, prompts_file, read_prompts, read_prompts_and_kinds
from engine.tools.bench import MethodResult, RunRecord, by_kind, format_table


def test_the_task_kinds_set_holds_four_prompts_of_each_of_six_kinds():
    kinds = Counter(kind for _, kind in read_prompts_and_kinds(TASK_KIND_PROMPTS))
    assert kinds == {kind: 4 for kind in ("chat", "translation", "summarization", "qa", "math", "code")}


def test_prompts_are_named_by_set_or_by_path(tmp_path):
    assert prompts_file(None) == CHAT_PROMPTS
    assert prompts_file(Path("task-kinds")) == TASK_KIND_PROMPTS
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"prompt": "a", "kind": "x"}\n{"prompt": "b"}\n', encoding="utf-8")
    assert prompts_file(mine) == mine
    assert read_prompts_and_kinds(mine) == [("a", "x"), ("b", "")]
    assert read_prompts(mine) == ["a", "b"]


def test_a_line_that_is_not_an_object_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('["a list"]\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        read_prompts_and_kinds(bad)


def result(method: str, runs: list[tuple[int, int, float]]) -> MethodResult:
    return MethodResult(method, [RunRecord(index, tuple(range(tokens)), seconds, None) for index, tokens, seconds in runs])


def test_each_kind_compares_a_method_with_ar_on_that_kinds_prompts_only():
    kinds = ["math", "qa", "math"]
    results = {
        "ar": result("ar", [(0, 10, 1.0), (1, 10, 2.0), (2, 30, 1.0)]),
        "ngram": result("ngram", [(0, 10, 0.5), (1, 10, 4.0), (2, 30, 1.5)]),
    }
    report = by_kind(results, ["ar", "ngram"], kinds)
    assert list(report) == ["math", "qa"]
    assert report["math"]["ar"]["tokens_per_s"] == pytest.approx(20.0)  # 40 tokens in 2 s
    assert report["math"]["ngram"]["speedup_vs_ar"] == pytest.approx((40 / 2.0) / 20.0)
    assert report["qa"]["ngram"]["speedup_vs_ar"] == pytest.approx(0.5)
    table = format_table({"results": [], "by_kind": report})
    assert "by kind of task" in table and "2.5 (0.50x)" in table


def test_the_bench_refuses_a_kind_the_file_lacks(capsys):
    from engine.cli import main

    assert main(["bench", "--prompts", "task-kinds", "--kind", "poetry"]) != 0
    assert "no prompts of kind 'poetry'" in capsys.readouterr().err

"""`tandem gui-bench` sends prompts through the real window and through the engine alone, and
its figures are measurements of those runs: the tokens the engine wrote, times within the run."""
from __future__ import annotations

import json

import pytest

from app import gui_bench
from engine import cli
from engine.config import DecodeSettings, demo_pair
from tests.app.fake_engine import FakeEngine, words

REPLY = "A short reply, in **markdown**:\n\n- one\n- two\n\n```python\nprint('hi')\n```\n\nThe end."
PROMPTS = ["Say something.", "Say something else."]


def test_the_report_counts_the_tokens_the_engine_wrote_and_times_the_window(qtbot, tmp_path):
    engine = FakeEngine(reply=REPLY, token_delay_s=0.01, stats_every_round=False)
    json_out = tmp_path / "figures.json"
    settings = DecodeSettings(temperature=0.7, max_new_tokens=64)
    assert gui_bench.command(demo_pair(), PROMPTS, ["ar", "default"], settings, json_out, engine=engine) == 0

    report = json.loads(json_out.read_text())
    assert [row["method"] for row in report["methods"]] == ["ar", "auto"]  # default: the app's method for the pair
    reply_tokens = len(words(REPLY))
    for row in report["methods"]:
        assert row["prompts"] == len(PROMPTS)
        assert row["engine_tokens"] == row["app_tokens"] == reply_tokens * len(PROMPTS) and row["unequal_replies"] == 0
        for run in row["per_prompt"]:
            app = run["app"]
            assert app["tokens"] == run["engine"]["tokens"] == reply_tokens
            assert 0 < app["streaming_s"] <= app["seconds"] < report["seconds"]
            assert 0 < app["longest_gap_s"] <= app["streaming_s"]
            assert app["updates"] >= 1  # the reply's text was shown while it streamed
            assert 0 <= app["main_thread_cpu_s"] <= app["streaming_s"] * 1.05
        assert row["app_tokens_per_s"] == pytest.approx(row["app_tokens"] / row["app_seconds"])
        assert row["app_to_engine"] == pytest.approx(row["app_tokens_per_s"] / row["engine_tokens_per_s"])
        assert 0 <= row["main_thread_cpu_share"] <= 1.05
    # Every prompt went through the engine twice per method, after a warm-up: alone first for the
    # first prompt, in the window first for the second (the headless runs ask for no live figures).
    sent = [(messages[-1].content, settings.stats_every_s >= 1e9) for messages, settings, _system in engine.requests]
    replies = [entry for entry in sent if entry[0] in PROMPTS]
    assert len(replies) == 8
    for method in range(2):
        first, second = replies[4 * method: 4 * method + 4][:2], replies[4 * method: 4 * method + 4][2:]
        assert [prompt for prompt, _ in first] == [PROMPTS[0]] * 2 and [prompt for prompt, _ in second] == [PROMPTS[1]] * 2
        assert first[0][1] != first[1][1] and second[0][1] == first[1][1] and second[1][1] == first[0][1]


def test_the_report_says_where_the_two_paths_wrote_replies_of_different_lengths():
    same = gui_bench.MethodFigures("ar", [gui_bench.RunFigures(0, 80, 0.4)], [gui_bench.RunFigures(0, 80, 0.45)])
    unequal = gui_bench.MethodFigures(
        "auto", [gui_bench.RunFigures(0, 256, 1.8), gui_bench.RunFigures(1, 90, 0.5)],
        [gui_bench.RunFigures(0, 133, 1.3), gui_bench.RunFigures(1, 90, 0.55)],
    )
    rows = [same.summary(), unequal.summary()]
    assert [row["unequal_replies"] for row in rows] == [0, 1]
    report = {"pair": "demo", "runtime": "fake", "qt_platform": "offscreen", "methods": rows,
              "settings": {"temperature": 0.7, "max_new_tokens": 256, "one_conversation": True}}
    notes = [line for line in gui_bench.format_report(report).splitlines() if "differ" in line]
    assert notes == ["auto: 1 of 2 replies differ between the paths (346 tokens alone, 223 in the window): "
                     "its ratio compares unequal work"]


def test_the_command_line_runs_the_app_bench_with_its_options(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(gui_bench, "command", lambda *args, **options: calls.append((args, options)) or 0)
    argv = ["gui-bench", "--limit", "2", "--methods", "ar,default", "--temperature", "0", "--max-new-tokens", "32",
            "--json", str(tmp_path / "out.json")]
    assert cli.main(argv) == 0
    (pair, prompts, names, settings, json_out), options = calls[0]
    assert pair == demo_pair() and len(prompts) == 2 and names == ["ar", "default"]
    assert settings.temperature == 0 and settings.max_new_tokens == 32 and json_out == tmp_path / "out.json"
    assert options == {"one_conversation": False}
    assert cli.main([*argv, "--one-conversation"]) == 0 and calls[1][1] == {"one_conversation": True}
    assert cli.main(["gui-bench", "--methods", "warp"]) == 2  # an unknown method is refused before any load


def test_in_one_conversation_both_paths_get_the_earlier_turns(qtbot, tmp_path):
    engine = FakeEngine(reply=REPLY, token_delay_s=0.005, stats_every_round=False)
    prompts = ["First question.", "Second question.", "Third question."]
    settings = DecodeSettings(temperature=0.7, max_new_tokens=64)
    json_out = tmp_path / "figures.json"
    assert gui_bench.command(demo_pair(), prompts, ["ar"], settings, json_out, engine=engine, one_conversation=True) == 0

    report = json.loads(json_out.read_text())
    assert report["settings"]["one_conversation"] is True
    asked = [[(m.role, m.content) for m in messages] for messages, _settings, _system in engine.requests
             if messages[-1].content in prompts]
    assert len(asked) == 2 * len(prompts)  # each prompt alone and in the window
    for index, prompt in enumerate(prompts):
        both = [messages for messages in asked if messages[-1] == ("user", prompt)]
        assert len(both) == 2 and both[0] == both[1]  # the same turns on both paths
        earlier = both[0][:-1]
        assert [role for role, _ in earlier] == ["user", "assistant"] * index
        assert [text for role, text in earlier if role == "user"] == prompts[:index]
        assert all(text == REPLY for role, text in earlier if role == "assistant")  # the window's own replies

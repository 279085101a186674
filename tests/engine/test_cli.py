"""The `tandem` command's headless subcommands, end to end on the demo target."""
from __future__ import annotations

import importlib.util
import io
import json
import math
from pathlib import Path

import pytest

from engine.tools.bench import ALL_METHODS
from engine.cli import _parser, _settings_from_args, main
from engine import methods
from engine.config import DecodeSettings, demo_pair

APPROXIMATE_METHODS = methods.APPROXIMATE_NAMES
METHODS = methods.NAMES
BENCH_PEERS = tuple(methods.BENCH_PEERS)
from engine.session import load_pair
from engine.terminal_chat import TerminalChat


def test_bench_reports_every_method_with_ratios_from_one_run(tmp_path, demo_target_folder, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name three colours."}\n{"prompt": "What is 2 + 2?"}\n', encoding="utf-8")
    report_path = tmp_path / "report.json"
    code = main(["bench", "--pair", "demo", "--runtime", "torch", "--precision", "fp32", "--prompts", str(prompts),
                 "--max-new-tokens", "12", "--methods", "all", "--json", str(report_path)])
    assert code == 0
    report = json.loads(report_path.read_text())
    rows = {row["method"]: row for row in report["results"]}
    expected = {"auto", "ar", "chain", "ngram", "hf-assisted"}
    if demo_pair().draft is not None:
        expected |= {"tree", "staged", "adaptive", "sprinter"}  # the demo draft ships calibrated heads
    if demo_pair().eagle is not None:
        expected |= {"eagle", "eagle-tree"}  # the demo pair ships an EAGLE-3 head
    if importlib.util.find_spec("llama_cpp") is not None:
        expected.add("llamacpp-ar")
    assert set(rows) == expected
    assert rows["ar"]["speedup_vs_ar"] == 1.0
    # fp32 kernels round the same for one token and for a whole tree: greedy output must match exactly.
    exact_methods = expected - {"ar", "llamacpp-ar"} - set(APPROXIMATE_METHODS)
    for method in exact_methods:
        assert rows[method]["exact_match_vs_ar"] == 1.0, method
    # Quality, scored after the timing: the same tokens have the same NLL under the target, the
    # peer hf-assisted's included, and every row has both figures.
    assert rows["ar"]["rouge_l_vs_ar"] == 1.0
    for method in exact_methods:
        assert rows[method]["target_nll"] == pytest.approx(rows["ar"]["target_nll"], rel=1e-5), method
        assert rows[method]["exact"] and rows[method]["rouge_l_vs_ar"] == 1.0, method
    for method in expected:
        assert math.isfinite(rows[method]["target_nll"]) and rows[method]["target_nll"] > 0, method
        assert 0.0 <= rows[method]["rouge_l_vs_ar"] <= 1.0, method
    for method in expected & set(APPROXIMATE_METHODS):
        assert rows[method]["exact"] is False and 0.0 <= rows[method]["unchecked_share"] <= 1.0
    assert rows["chain"]["mean_accepted_per_target_call"] >= 1.0
    assert len(rows["chain"]["per_prompt"]) == 2
    assert report["machine"]["cpu_cores"] >= 1
    # Where a tree round's time goes, as the automatic shapes measured it in this run.
    tree_methods = expected & {"tree", "staged", "eagle-tree"}
    assert set(report["tree_shapes"]) == tree_methods
    for method in tree_methods:
        assert report["tree_shapes"][method]["verify_ms_by_tokens"]
        assert report["tree_shapes"][method]["rounds"] > 0
    table = capsys.readouterr().out
    assert "hf-assisted" in table and "tok/s" in table
    # the target's forward plan heads the table, as the JSON has it
    assert "precision fp32 (the pair's setting)" in report["pair"]["forward_plan"]
    assert f"target forward plan: {report['pair']['forward_plan']}" in table
    assert all(f"{method} (auto shape): verify ms by tokens" in table for method in tree_methods)


def test_llamacpp_peer_on_the_runtimes_own_file_writes_what_ar_writes(tmp_path, capsys, demo_target_path):
    # llamacpp-ar-same is llama-cpp-python's generation of the very file Tandem's llama.cpp
    # runtime runs (the demo target's Q8_0 copy): greedy, it must write ar's replies, so the
    # speed ratio in the report compares two loops over the same weights and kernels.
    pytest.importorskip("llama_cpp")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Name three colours."}\n{"prompt": "What is 2 + 2?"}\n', encoding="utf-8")
    report_path = tmp_path / "report.json"
    code = main(["bench", "--pair", "demo", "--runtime", "llama.cpp", "--prompts", str(prompts), "--max-new-tokens", "12",
                 "--methods", "ar,llamacpp-ar-same", "--json", str(report_path)])
    assert code == 0
    rows = {row["method"]: row for row in json.loads(report_path.read_text())["results"]}
    assert rows["llamacpp-ar-same"]["exact_match_vs_ar"] == 1.0
    assert rows["llamacpp-ar-same"]["tokens_per_s"] > 0
    output = capsys.readouterr().out.splitlines()
    header = next(line for line in output if line.startswith("method "))
    rows_shown = [line for line in output if line.startswith(("ar ", "llamacpp-ar-same "))]
    # The columns line up after the longest name: each row's tok/s figure ends where the header's does.
    tok_s_end = header.index("tok/s") + len("tok/s")
    assert len(rows_shown) == 2 and all(line[tok_s_end - 1].isdigit() and line[tok_s_end] == " " for line in rows_shown), rows_shown


def test_bench_help_names_every_bench_method(capsys):
    assert METHODS + BENCH_PEERS == ALL_METHODS
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    assert ",".join(ALL_METHODS) in help_text and "nll" in help_text and "rougeL" in help_text


def test_bench_refuses_an_unknown_method(capsys):
    assert main(["bench", "--methods", "ar,warp-drive"]) == 2
    assert "unknown method 'warp-drive'" in capsys.readouterr().err


def test_missing_model_file_is_a_clear_error(tmp_path, capsys):
    assert main(["bench", "--target", str(tmp_path / "nope.gguf"), "--methods", "ar"]) == 2
    assert "not found" in capsys.readouterr().err.lower()


def test_unknown_pair_is_a_clear_error(capsys):
    assert main(["chat", "--pair", "no-such-pair"]) == 2
    assert "unknown pair 'no-such-pair'" in capsys.readouterr().err


def test_terminal_chat_streams_a_reply_and_keeps_history(demo_target_folder):
    pair = load_pair(demo_pair())
    lines = iter(["Name the capital city of Italy.", "/stats", "/quit"])
    out = io.StringIO()
    chat = TerminalChat(pair, DecodeSettings(max_new_tokens=16), None, read=lambda prompt: next(lines), out=out)
    assert chat.run() == 0
    text = out.getvalue()
    assert "Rome" in text
    assert "tok/s" in text  # the stats line
    assert [m.role for m in chat.history] == ["user", "assistant"]


def test_chat_samples_by_default_and_bench_stays_greedy():
    def temperature(argv: list[str]) -> float:
        return _settings_from_args(_parser().parse_args(argv), METHODS).temperature

    assert temperature(["chat"]) == 0.7  # Regenerate-like retries differ, as in other chat apps
    assert temperature(["chat", "--temperature", "0"]) == 0.0
    assert temperature(["bench"]) == 0.0  # the benchmarks and their goals are at temperature 0

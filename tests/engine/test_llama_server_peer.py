"""llama.cpp's own llama-server as rows of `tandem bench` (engine/tools/llama_server.py): the
arguments each row starts it with, and the bench's plumbing through a stand-in program that
answers as llama-server does; with the real program where $LLAMA_SERVER names one."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

from engine.config import ConfigError, DecodeSettings, ModelSpec, PairConfig
from engine.models import LoadedModel
from engine.session import LoadedPair
from engine.tools import llama_server
from engine.tools.bench import Bench, ServerPeer, available_methods, format_table

from .tiny_models import TEMPLATE, WORDS, tiny_llama

# Answers /health, and /completion with the prompt's last three ids reversed, a draft count
# per row kind, and its arguments in the file $STAND_IN_LOG names (one JSON line per start).
STAND_IN = '''
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
arguments = sys.argv[1:]
with open(os.environ["STAND_IN_LOG"], "a") as log:
    log.write(json.dumps(arguments) + "\\n")
port = int(arguments[arguments.index("--port") + 1])
speculative = "--spec-type" in arguments

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer({"status": "ok"})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(os.environ["STAND_IN_LOG"], "a") as log:
            log.write(json.dumps({"request": request}) + "\\n")
        tokens = list(reversed(request["prompt"][-3:]))[: request["n_predict"]]
        timings = {"predicted_n": len(tokens), "draft_n": 6, "draft_n_accepted": 3} if speculative else {"predicted_n": len(tokens)}
        self.answer({"tokens": tokens, "timings": timings})

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> tuple[Path, Path]:
    program = tmp_path / "llama-server"
    program.write_text(f"#!{sys.executable}\n{STAND_IN}", encoding="utf-8")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    return program, log


@pytest.fixture
def pair(make_word_tokenizer, tmp_path) -> LoadedPair:
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    target = LoadedModel(tiny_llama(seed=3, vocab_size=64), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=512)
    # The llama-server rows run the target's GGUF: a path is all the stand-in needs
    loaded = LoadedPair(PairConfig("tiny", ModelSpec(str(tmp_path / "target.gguf"))), target, None)
    loaded.stop_token_ids = frozenset()
    return loaded


def logged(log: Path) -> tuple[list[list[str]], list[dict]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line for line in lines if isinstance(line, list)], [line["request"] for line in lines if isinstance(line, dict)]


def test_each_row_starts_the_server_with_its_own_kind_of_decoding():
    settings = DecodeSettings(draft_tokens=5)
    target, draft = Path("t.gguf"), Path("d.gguf")
    plain = llama_server.server_arguments(llama_server.PLAIN, target, None, 2048, 3, settings)
    assert plain == ["-m", "t.gguf", "-c", "2048", "-t", "3", "-tb", "3", "--poll", "0"]  # no spinning beside other rows
    ngram = llama_server.server_arguments(llama_server.NGRAM, target, None, 2048, 3, settings)
    assert ngram[-2:] == ["--spec-type", "ngram-mod"]
    drafted = llama_server.server_arguments(llama_server.DRAFT, target, draft, 2048, 3, settings)
    assert drafted[drafted.index("-md") + 1] == "d.gguf"
    assert drafted[drafted.index("--spec-draft-n-max") + 1] == "5"  # the bench's K
    assert "--spec-synth-rates" not in drafted
    with pytest.raises(ConfigError, match="draft GGUF"):
        llama_server.server_arguments(llama_server.DRAFT, target, None, 2048, 3, settings)


def test_at_synthetic_rates_both_speculative_rows_draft_as_deep_as_the_rates_and_keep_by_them():
    settings = DecodeSettings(synthetic_acceptance=(0.8, 0.64, 0.51))
    for method in (llama_server.NGRAM, llama_server.DRAFT):
        arguments = llama_server.server_arguments(method, Path("t.gguf"), Path("d.gguf"), 2048, 2, settings)
        assert arguments[arguments.index("--spec-synth-rates") + 1] == "0.8,0.64,0.51"
    drafted = llama_server.server_arguments(llama_server.DRAFT, Path("t.gguf"), Path("d.gguf"), 2048, 2, settings)
    assert drafted[drafted.index("--spec-draft-n-max") + 1] == "3"
    assert "--spec-synth-rates" not in llama_server.server_arguments(llama_server.PLAIN, Path("t.gguf"), None, 2048, 2, settings)


def test_the_rows_are_offered_only_with_a_program_and_a_target_gguf(stand_in, pair, monkeypatch):
    program, _ = stand_in
    monkeypatch.delenv(llama_server.ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setenv("PATH", str(program.parent / "nowhere"))
    assert llama_server.find_binary() is None
    with pytest.raises(ConfigError, match="no llama-server at"):
        llama_server.find_binary(program.parent / "missing")
    monkeypatch.setenv(llama_server.ENVIRONMENT_VARIABLE, str(program))
    assert llama_server.find_binary() == program
    assert available_methods(pair, ServerPeer(program))[-2:] == ["llama-server", "llama-server-ngram"]
    assert available_methods(pair, ServerPeer(program, Path("d.gguf")))[-1] == "llama-server-draft"
    assert not {"llama-server", "llama-server-ngram"} & set(available_methods(pair, ServerPeer(None)))
    folder_target = LoadedPair(PairConfig("folder", ModelSpec(str(program.parent))), pair.target, None)
    assert "llama-server" not in available_methods(folder_target, ServerPeer(program))
    assert "llama-server" in available_methods(folder_target, ServerPeer(program, target_gguf=Path("t.gguf")))


def test_a_target_gguf_given_for_the_rows_is_what_the_server_runs(stand_in, pair):
    program, log = stand_in
    given = Path("/models/same-weights.q8_0.gguf")
    bench = Bench(pair, DecodeSettings(max_new_tokens=2), server=ServerPeer(program, target_gguf=given))
    bench.run(["w1 w2 w3"], ["llama-server"], progress=lambda _: None)
    starts, _ = logged(log)
    assert starts[0][starts[0].index("-m") + 1] == str(given)


def test_the_bench_sends_tandems_prompt_ids_and_scores_the_servers_replies(stand_in, pair):
    program, log = stand_in
    settings = DecodeSettings(max_new_tokens=2, seed=7)
    report = Bench(pair, settings, server=ServerPeer(program)).run(["w1 w2 w3"], ["ar", "llama-server", "llama-server-ngram"], progress=lambda _: None)
    starts, requests = logged(log)
    assert len(starts) == 2  # one server per row, for the whole run
    assert ["--spec-type", "ngram-mod"] == starts[1][-2:] or ["--spec-type", "ngram-mod"] == starts[0][-2:]
    request = requests[-1]
    assert request["cache_prompt"] is False and request["return_tokens"] is True
    assert request["n_predict"] == 2 and request["temperature"] == 0.0 and request["top_k"] == 1  # greedy, as the bench
    prompt_ids = request["prompt"]
    assert all(isinstance(token, int) for token in prompt_ids) and len(prompt_ids) > 3  # the chat prompt as token ids
    rows = {row["method"]: row for row in report["results"]}
    assert rows["llama-server"]["tokens"] == 2
    assert rows["llama-server"]["acceptance_rate"] is None  # plain decoding drafts nothing
    assert rows["llama-server-ngram"]["acceptance_rate"] == pytest.approx(0.5)  # the stand-in's 3 of 6
    assert rows["llama-server"]["target_calls_per_token"] is None  # not reported by the server: unknown
    assert rows["llama-server"]["target_nll"] is not None  # scored by Tandem's target like every row
    assert "llama-server-ngram" in format_table(report)


def test_the_servers_are_stopped_when_the_run_ends_even_on_an_error(stand_in, pair):
    program, log = stand_in
    bench = Bench(pair, DecodeSettings(max_new_tokens=2), server=ServerPeer(program))
    with pytest.raises(ConfigError):
        bench.run(["w1"], ["llama-server", "llama-server-draft"], progress=lambda _: None)  # no draft GGUF
    assert bench._servers == []
    processes = [line for line in os.popen("ps -eo args").read().splitlines() if str(program) in line]
    assert processes == []


@pytest.mark.skipif(not os.environ.get(llama_server.ENVIRONMENT_VARIABLE), reason="$LLAMA_SERVER names no llama.cpp build")
def test_the_real_llama_server_writes_a_greedy_reply_of_the_demo_target(demo_target_path):
    server = llama_server.LlamaServer(Path(os.environ[llama_server.ENVIRONMENT_VARIABLE]),
                                      llama_server.server_arguments(llama_server.PLAIN, demo_target_path, None, 1024, 2, DecodeSettings()))
    try:
        first = server.complete(llama_server.PLAIN, [1, 2, 3, 4], 8, DecodeSettings())
        again = server.complete(llama_server.PLAIN, [1, 2, 3, 4], 8, DecodeSettings())
    finally:
        server.close()
    assert len(first.token_ids) == 8 and first.token_ids == again.token_ids

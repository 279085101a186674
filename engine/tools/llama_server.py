"""llama.cpp's own `llama-server` as a peer in `tandem bench`: the C++ program LM Studio and
Ollama run, not llama-cpp-python's Python loop. Three ways of running it on the target's GGUF
file, each a method row of the bench:

- `llama-server`: its plain decoding;
- `llama-server-ngram`: its draftless speculative decoding (`--spec-type ngram-mod`);
- `llama-server-draft`: speculative decoding with a draft GGUF (`-md`), at the bench's
  synthetic acceptance rates where it has them (`--spec-synth-rates`, llama.cpp's own
  benchmarking switch, whose semantics `--synthetic-acceptance` follows).

Each server gets Tandem's prompt as token ids (`/completion`, so no chat template can differ),
the same token budget, sampling and threads, and hands the reply's token ids back, so the
bench scores its replies as it scores its own (exact match, NLL, ROUGE-L). Its prompt cache is
off, as Tandem resets its caches before every timed reply. A reply's time is the request's
wall-clock time on loopback: prompt reading included, as in Tandem's rows.

The servers run side by side for the whole bench, so their rows interleave with Tandem's
prompt by prompt: the weights are mapped from the same file, so they are shared, not copied,
and their threads sleep while another row runs (`--poll 0`).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..config import ConfigError, DecodeSettings
from ..stats import GenerationStats

# The bench's rows (described in methods.BENCH_PEERS)
PLAIN = "llama-server"
NGRAM = "llama-server-ngram"
DRAFT = "llama-server-draft"
METHODS = (PLAIN, NGRAM, DRAFT)
ENVIRONMENT_VARIABLE = "LLAMA_SERVER"
STARTUP_TIMEOUT_S = 300.0  # a large GGUF on a slow disk is read before /health answers
REPLY_TIMEOUT_S = 1800.0


def find_binary(given: Path | None = None) -> Path | None:
    """The llama-server to run: `given`, else $LLAMA_SERVER, else one on PATH."""
    for candidate in (given, os.environ.get(ENVIRONMENT_VARIABLE), shutil.which("llama-server")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    if given is not None:
        raise ConfigError(f"no llama-server at {given}")
    return None


def offered(binary: Path | None, target_gguf: Path | None, draft_gguf: Path | None) -> list[str]:
    """The llama-server methods a bench can run: none without a binary and a target GGUF."""
    if binary is None or target_gguf is None:
        return []
    return [PLAIN, NGRAM] + ([DRAFT] if draft_gguf is not None else [])


@dataclass(frozen=True)
class ServerReply:
    token_ids: tuple[int, ...]
    seconds: float
    stats: GenerationStats


class LlamaServer:
    """One llama-server process on loopback, started at once and stopped by `close`."""

    def __init__(self, binary: Path, arguments: list[str]):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(binary), "--host", "127.0.0.1", "--port", str(self.port), "-np", "1", *arguments]
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._client = httpx.Client(base_url=self.url, timeout=REPLY_TIMEOUT_S)
        try:
            self._wait_until_ready()
        except BaseException:
            self.close()
            raise

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = (self._process.stderr.read() or "").strip().splitlines()[-5:]
                raise ConfigError("llama-server exited while starting: " + " | ".join(tail))
            try:
                if self._client.get("/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass  # not listening yet
            time.sleep(0.2)
        raise ConfigError(f"llama-server did not become ready within {STARTUP_TIMEOUT_S:.0f} s")

    def complete(self, method: str, prompt_ids: list[int], max_new_tokens: int, settings: DecodeSettings) -> ServerReply:
        body = {
            "prompt": list(prompt_ids), "n_predict": max_new_tokens, "cache_prompt": False, "return_tokens": True,
            "stream": False, "seed": settings.seed if settings.seed is not None else 0,
        }
        if settings.greedy:
            body |= {"temperature": 0.0, "top_k": 1}
        else:
            body |= {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": settings.top_k}
        started = time.perf_counter()
        response = self._client.post("/completion", json=body)
        seconds = time.perf_counter() - started
        if response.status_code != 200:
            raise ConfigError(f"llama-server answered {response.status_code}: {response.text[:200]}")
        reply = response.json()
        token_ids = tuple(reply["tokens"])
        timings = reply.get("timings", {})
        stats = GenerationStats(
            method=method, tokens_generated=len(token_ids), elapsed_s=seconds,
            draft_tokens_proposed=int(timings.get("draft_n", 0)), draft_tokens_accepted=int(timings.get("draft_n_accepted", 0)),
        )
        return ServerReply(token_ids, seconds, stats)

    def close(self) -> None:
        self._client.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process.stderr is not None:
            self._process.stderr.close()


def server_arguments(method: str, target_gguf: Path, draft_gguf: Path | None, context_length: int, threads: int,
                     settings: DecodeSettings) -> list[str]:
    """The command-line arguments after host, port and slots that run `method`. At synthetic
    rates both speculative kinds keep drafts by them, as Tandem's methods do in that run."""
    # --poll 0: its threads sleep between requests. By default they spin a while after each
    # one, and on 2 cores that spinning took CPU from the Tandem rows interleaved with it.
    arguments = ["-m", str(target_gguf), "-c", str(context_length), "-t", str(threads), "-tb", str(threads), "--poll", "0"]
    rates = settings.synthetic_acceptance
    if method == PLAIN:
        return arguments
    if method == NGRAM:
        arguments += ["--spec-type", "ngram-mod"]
    elif method == DRAFT:
        if draft_gguf is None:
            raise ConfigError(f"{DRAFT} needs a draft GGUF file (--llama-server-draft)")
        depth = len(rates) if rates else settings.draft_tokens
        arguments += ["-md", str(draft_gguf), "-td", str(threads), "--spec-type", "draft-simple",
                      "--spec-draft-n-max", str(depth), "--spec-draft-n-min", "0"]
    else:
        raise ValueError(f"not a llama-server method: {method}")
    if rates:
        arguments += ["--spec-synth-rates", ",".join(f"{rate:g}" for rate in rates)]
    return arguments


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

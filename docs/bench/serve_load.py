"""`tandem serve` measured from outside: its tok/s against `tandem bench` on the same prompts,
and a bounded load of concurrent clients on loopback.

    python docs/bench/serve_load.py OUT.json [--clients 20] [--requests 5] [--max-tokens 48]

It starts `tandem serve` on the demo pair at a free 127.0.0.1 port (and stops it), then:
1. alone: each of the first 4 shipped prompts once, greedy, one at a time, streamed; tok/s is
   the reply's tokens over the time from the request to its last chunk (as `tandem bench`
   times a reply: prompt reading included);
2. load: CLIENTS threads each send REQUESTS greedy requests (prompts in turn) at once and
   check every reply equals the same request made alone; it reports the queue time the
   server measured, the wall time, and the server's resident memory before and after.
Only 127.0.0.1 is ever contacted; every loop is bounded.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import psutil

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPOSITORY))

from engine.prompts import CHAT_PROMPTS, read_prompts  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    command = [str(Path(sys.executable).parent / "tandem"), "serve", "--port", str(port), "--max-waiting", "256"]
    server = subprocess.Popen(command, cwd=REPOSITORY, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("model"):
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            raise RuntimeError(f"tandem serve ended: {server.stderr.read()[-2000:]}")
        time.sleep(0.5)
    server.kill()
    raise TimeoutError("tandem serve did not load its pair in 300 s")


def ask(client: openai.OpenAI, prompt: str, max_tokens: int) -> tuple[str, int, float, dict]:
    """One streamed greedy chat request: (text, completion tokens, seconds, timings)."""
    started = time.perf_counter()
    text, usage, timings = [], None, {}
    stream = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=max_tokens,
        stream=True, stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        extra = getattr(chunk, "model_extra", None) or {}
        timings = extra.get("timings", timings)
    return "".join(text), usage or 0, time.perf_counter() - started, timings


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    prompts = read_prompts(CHAT_PROMPTS)[:4]
    port = free_port()
    server = start_server(port)
    report: dict = {"port": port, "prompts": len(prompts), "max_tokens": args.max_tokens}
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        memory = psutil.Process(server.pid)
        ask(client, "Hello", 8)  # warm-up
        alone = {}
        tokens = seconds = 0.0
        for prompt in prompts:
            text, count, took, _ = ask(client, prompt, args.max_tokens)
            alone[prompt] = text
            tokens, seconds = tokens + count, seconds + took
        report["alone_tokens_per_s"] = tokens / seconds
        report["rss_mb_before_load"] = memory.memory_info().rss / 2**20

        results, failures, lock = [], [], threading.Lock()

        def client_thread(index: int) -> None:
            own = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
            for request in range(args.requests):
                prompt = prompts[(index + request) % len(prompts)]
                try:
                    text, count, took, timings = ask(own, prompt, args.max_tokens)
                except Exception as error:  # noqa: BLE001 -- counted and reported
                    with lock:
                        failures.append(repr(error))
                    continue
                with lock:
                    results.append((text == alone[prompt], count, took, timings.get("queue_ms")))

        started = time.perf_counter()
        threads = [threading.Thread(target=client_thread, args=(index,)) for index in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=1800)
        wall = time.perf_counter() - started
        queue_ms = sorted(q for *_, q in results if q is not None)
        report["load"] = {
            "clients": args.clients, "requests_each": args.requests, "replies": len(results), "failures": failures,
            "equal_to_alone": sum(1 for equal, *_ in results if equal),
            "wall_s": wall, "tokens_per_s_overall": sum(count for _, count, _, _ in results) / wall,
            "queue_ms_median": queue_ms[len(queue_ms) // 2] if queue_ms else None, "queue_ms_max": queue_ms[-1] if queue_ms else None,
        }
        time.sleep(2)
        report["rss_mb_after_load"] = memory.memory_info().rss / 2**20
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

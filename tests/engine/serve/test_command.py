"""`tandem serve` as a user runs it: the demo pair served on loopback, asked by the official
`openai` client, stopped with Ctrl-C."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from engine.cli import main


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_bad_limits_are_refused_before_the_pair_loads(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--max-tokens-limit", "0"])
    assert exited.value.code == 2
    assert "--max-tokens-limit: must be at least 1, not 0" in capsys.readouterr().err


def test_the_demo_pair_is_served_to_the_openai_client(demo_target_folder, tmp_path):
    port = free_loopback_port()
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-c", "from engine.cli import main; raise SystemExit(main())", "serve", "--port", str(port), "--api-key", "k"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300  # loading the demo pair: about 20 s on 2 cores
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(f"{url}/health").json()["model"] == "demo":
                    break
            except httpx.TransportError:
                time.sleep(1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=120)
        assert [model.id for model in client.models.list().data][0] == "demo"
        question = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model="demo", messages=question, max_tokens=24, temperature=0)
        assert "Paris" in whole.choices[0].message.content
        timings = whole.model_extra["timings"]
        assert timings["approximate"] is False and timings["predicted_n"] == whole.usage.completion_tokens > 0
        streamed = client.chat.completions.create(model="demo", messages=question, max_tokens=24, temperature=0, stream=True)
        assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == whole.choices[0].message.content
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C
        code = server.wait(timeout=60)
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()

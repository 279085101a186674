"""llama.cpp's own `llama-server` as the peer, on 127.0.0.1: plain decoding, and with a draft model
at synthetic per-depth acceptance rates (`--spec-synth-rates`), tok/s from its own `timings`.

Build the tools from the llama.cpp that llama-cpp-python 0.3.36 vendors (~8 minutes on 2 cores):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build -j2 --target llama-server llama-bench llama-quantize
    PYTHONPATH=gguf-py python convert_hf_to_gguf.py SHAPE_DIR --outtype bf16 --outfile shape-bf16.gguf
    build/bin/llama-quantize shape-bf16.gguf shape-q8_0.gguf Q8_0

then: LLAMA_SERVER=.../build/bin/llama-server python docs/bench/llamacpp_peer.py TARGET.gguf DRAFT.gguf RATES MAX_TOKENS PROMPTS
(DRAFT "-" for plain decoding only). Same prompts as `tandem bench --limit PROMPTS` (the shipped set), greedy.
"""
import os
import json, subprocess, sys, time, httpx
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from engine.prompts import CHAT_PROMPTS, read_prompts
SERVER = os.environ.get("LLAMA_SERVER", "llama-server")
def run(model, extra, prompts, max_tokens, port=18090):
    cmd = [SERVER, "-m", model, "-t", "2", "-tb", "2", "-c", "4096", "--host", "127.0.0.1", "--port", str(port), "-np", "1", *extra]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200: break
            except httpx.HTTPError: pass
            time.sleep(0.5)
        out = []
        for prompt in ["Hello"] + prompts:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}],
                "temperature": 0, "max_tokens": max_tokens}, timeout=600).json()
            out.append(r.get("timings", {}))
        out = out[1:]
        toks = sum(t["predicted_n"] for t in out); ms = sum(t["predicted_ms"] for t in out)
        pms = sum(t.get("prompt_ms", 0) for t in out)
        acc = [(t.get("draft_n"), t.get("draft_n_accepted")) for t in out]
        return {"decode_tok_s": toks / ms * 1000, "with_prompt_tok_s": toks / (ms + pms) * 1000, "tokens": toks, "draft": acc}
    finally:
        p.terminate(); p.wait(30)
if __name__ == "__main__":
    target, draft, rates, max_tokens, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    prompts = read_prompts(CHAT_PROMPTS)[:limit]
    report = {"plain": run(target, [], prompts, max_tokens)}
    if draft != "-":
        n = len(rates.split(","))
        report["draft"] = run(target, ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(n), "--spec-draft-n-min", "0", "-td", "2", "--spec-synth-rates", rates], prompts, max_tokens, 18091)
    print(json.dumps(report, indent=1))

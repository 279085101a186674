"""The llama.cpp runtime behind the runtime contract, on the demo GGUF re-quantised to F32
(F32 kernels round alike for any batch, so tree and chain logits can be compared tightly)."""
from __future__ import annotations

import logging
import random

import pytest
import torch

pytest.importorskip("llama_cpp")

from engine.config import ModelSpec, DecodeSettings, PairConfig
from engine.chat_prompt import Message
from engine.errors import ModelLoadError
from engine.models import load_model
from engine.runtime import llamacpp_library
from engine.runtime.llamacpp import LlamaCppRuntime, load_weights
from engine.session import LoadedPair
from engine.tree import TokenTree, forward_tree, keep_path

# F32 kernels still round a little differently by batch shape (~4e-3 here); a token that
# sees a wrong cell moves its logits by whole units.
TOLERANCE = 3e-2


@pytest.fixture(scope="module")
def f32_weights(demo_target_path):
    weights = load_weights(llamacpp_library.quantised_copy(demo_target_path, "fp32"), use_gpu=False)
    yield weights
    weights.close()


def fresh_logits(weights, ids: list[int]) -> torch.Tensor:
    runtime = LlamaCppRuntime(weights, 512)
    try:
        return runtime.logits_for(ids)[-1]
    finally:
        runtime.close()


def random_tree(rng: random.Random, root: int, nodes: int) -> TokenTree:
    tokens, parents = [root], [-1]
    while len(tokens) <= nodes:
        parent = rng.randrange(len(tokens))
        token = rng.randrange(200, 40000)
        if all(not (p == parent and t == token) for p, t in zip(parents, tokens)):
            tokens.append(token)
            parents.append(parent)
    return TokenTree(tokens, parents)


def test_a_tree_in_one_decode_gives_each_path_its_own_logits(f32_weights):
    rng = random.Random(0)
    context = [rng.randrange(200, 40000) for _ in range(24)]
    runtime = LlamaCppRuntime(f32_weights, 512)
    runtime.logits_for(context[:10])  # part of the context already cached
    tree = random_tree(rng, context[-1], nodes=9)
    logits = forward_tree(runtime, context, tree)
    assert logits.shape == (len(tree), f32_weights.vocab_size)
    for node in range(len(tree)):
        path = [tree.tokens[n] for n in tree.path(node)]
        assert torch.allclose(logits[node], fresh_logits(f32_weights, context + path), atol=TOLERANCE), node


@pytest.mark.parametrize("seed", range(3))
def test_keeping_a_path_leaves_the_cache_of_that_path_alone(f32_weights, seed):
    rng = random.Random(seed)
    context = [rng.randrange(200, 40000) for _ in range(16)]
    runtime = LlamaCppRuntime(f32_weights, 512)
    runtime.logits_for(context)
    tree = random_tree(rng, context[-1], nodes=8)
    forward_tree(runtime, context, tree)
    leaf = rng.choice([n for n in range(1, len(tree)) if not tree.child_count(n)])
    path = tree.path(leaf)[: rng.randint(0, tree.depths[leaf])]
    keep_path(runtime, len(context), path)
    kept = context + [tree.tokens[n] for n in path]
    assert runtime.cached_ids == kept
    # Several tokens after the kept path, in one decode: they must see exactly the path.
    follow = [rng.randrange(200, 40000) for _ in range(3)]
    logits = runtime.forward(follow, logits_wanted=3)
    for index in range(3):
        assert torch.allclose(logits[index], fresh_logits(f32_weights, kept + follow[: index + 1]), atol=TOLERANCE)


def test_a_chain_rolls_back_with_a_crop(f32_weights):
    runtime = LlamaCppRuntime(f32_weights, 512)
    runtime.forward(list(range(300, 320)))
    runtime.crop(12)
    assert len(runtime) == 12
    logits = runtime.forward([7, 8], logits_wanted=1)[-1]
    assert torch.allclose(logits, fresh_logits(f32_weights, list(range(300, 312)) + [7, 8]), atol=TOLERANCE)


def test_greedy_chain_and_tree_decoding_equal_plain_decoding_on_llamacpp(demo_target_path):
    target = load_model(ModelSpec("demo-target", precision="fp32"), runtime="llama.cpp")
    # The target drafts for itself through a second context: every draft is right, so rounds
    # verify long chains and trees, and any slip in the cache shows in the output.
    draft = load_model(ModelSpec("demo-target", precision="fp32"), runtime="llama.cpp", as_draft=True)
    pair = LoadedPair(PairConfig("self", ModelSpec("demo-target"), ModelSpec("demo-target")), target, draft)
    assert set(pair.methods) >= {"ar", "chain", "tree", "staged"}
    replies = {}
    for method in ("ar", "chain", "tree", "staged"):
        settings = DecodeSettings(method=method, max_new_tokens=40, tree_shape="8x4" if method != "ar" and method != "chain" else "auto")
        events = list(pair.generate([Message("user", "Write two sentences about rivers.")], settings))
        replies[method] = events[-1].token_ids
        if method != "ar":
            assert events[-1].stats.target_calls < len(replies[method])  # drafts were accepted
    assert replies["chain"] == replies["ar"]
    assert replies["tree"] == replies["ar"]
    assert replies["staged"] == replies["ar"]
    pair.close()


def test_a_truncated_gguf_is_a_clear_error_naming_the_file(demo_target_path, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(demo_target_path.read_bytes()[: 4_000_000])
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        load_weights(broken, use_gpu=False)


def test_a_file_that_is_no_gguf_is_a_clear_error(tmp_path):
    fake = tmp_path / "notes.gguf"
    fake.write_text("not a model")
    with pytest.raises(ModelLoadError, match="notes.gguf"):
        load_model(ModelSpec(str(fake)), runtime="llama.cpp")


def test_a_build_without_a_needed_symbol_names_the_version(monkeypatch):
    import llama_cpp

    monkeypatch.delattr(llama_cpp, "llama_memory_seq_cp")
    with pytest.raises(ModelLoadError, match=r"llama-cpp-python .* lacks llama_memory_seq_cp"):
        llamacpp_library.library()


def test_llamacpp_returns_the_final_hidden_state_beside_the_logits(f32_weights):
    """What the learned verifier heads will need: with `embeddings` on and no pooling, one
    decode gives each token's final-norm hidden state and its logits."""
    llama_cpp = llamacpp_library.library()
    runtime = LlamaCppRuntime(f32_weights, 256, hidden_states=True)
    logits = runtime.forward([300, 301, 302], logits_wanted=2)
    hidden = runtime.last_hidden_states()
    assert hidden.shape == (2, llama_cpp.llama_model_n_embd(f32_weights.handle))
    assert torch.isfinite(hidden).all() and hidden.abs().sum() > 0
    assert torch.allclose(logits[-1], fresh_logits(f32_weights, [300, 301, 302]), atol=TOLERANCE)


def test_a_corrupt_gguf_is_reported_by_the_llamacpp_runtime_and_leaves_no_cache(tmp_path):
    import os

    from engine.paths import cache_dir

    corrupt = tmp_path / "y.gguf"
    corrupt.write_bytes(os.urandom(4096))
    with pytest.raises(ModelLoadError, match="y.gguf"):
        load_model(ModelSpec(str(corrupt)), runtime="llama.cpp")
    assert not list((cache_dir() / "models").glob("y-*")) and not list((cache_dir() / "models").glob(".y-*"))


def test_auto_runs_a_gguf_target_on_llamacpp_and_names_the_runtime(demo_target_path, monkeypatch):
    from engine import runtime_choice
    from engine.config import demo_pair
    from engine.session import load_pair

    # where torch's native forward was measured faster, auto runs the demo target there instead (test_tune.py)
    monkeypatch.setattr(runtime_choice, "measured_here", lambda: False)
    pair = load_pair(PairConfig("demo", ModelSpec("demo-target"), demo_pair().draft))
    try:
        assert pair.target.runtime == "llama.cpp"
        assert pair.describe()["runtime"].startswith("llama.cpp")
        events = list(pair.generate([Message("user", "Say hello.")], DecodeSettings(method="tree", max_new_tokens=12)))
        assert events[-1].token_ids and events[-1].stats.tokens_per_s > 0
    finally:
        pair.close()


def test_a_model_on_the_cpu_runs_without_flash_attention(f32_weights, caplog):
    # llama.cpp's own choice (auto) is its flash-attention kernel, which on the CPU made a
    # step 1.4x and an 8-token verify 1.6x dearer after 300 tokens of context (2.6x and 5.6x
    # after 3,584; docs/BENCHMARKS.md). llama.cpp says in its log what the context runs.
    assert f32_weights.gpu_layers == 0
    caplog.set_level(logging.DEBUG, logger=llamacpp_library.debug_log.name)
    runtime = LlamaCppRuntime(f32_weights, 512)
    try:
        settings = [record.getMessage() for record in caplog.records if "flash_attn" in record.getMessage()]
        assert settings and all(line.split("=")[-1].strip() == "disabled" for line in settings), settings
        assert runtime.logits_for([300, 301, 302]).shape == (1, f32_weights.vocab_size)
    finally:
        runtime.close()

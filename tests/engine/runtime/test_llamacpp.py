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
# Held-out prompts whose greedy replies the chain test compares (few: each costs two replies)
PROMPTS_CHECKED = 3


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


def test_a_model_on_the_cpu_verifies_with_flash_attention_over_an_8_bit_cache(f32_weights, caplog):
    # The one attention of llama.cpp's CPU kernels that rounds a batch's tokens as it rounds
    # a single token (llamacpp_context.verifying_attention). llama.cpp says in its log what
    # the context runs.
    assert f32_weights.gpu_layers == 0
    caplog.set_level(logging.DEBUG, logger=llamacpp_library.debug_log.name)
    runtime = LlamaCppRuntime(f32_weights, 512)
    try:
        lines = [record.getMessage() for record in caplog.records]
        settings = [line for line in lines if "flash_attn" in line]
        assert settings and all(line.split("=")[-1].strip() == "enabled" for line in settings), settings
        assert any("K (q8_0)" in line and "V (q8_0)" in line for line in lines), lines
        assert runtime.logits_for([300, 301, 302]).shape == (1, f32_weights.vocab_size)
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def q8_weights(demo_target_path):
    """The demo target as chats run it on llama.cpp (precision auto: Q8_0)."""
    weights = load_weights(llamacpp_library.quantised_copy(demo_target_path, "int8"), use_gpu=False)
    yield weights
    weights.close()


def test_a_verified_token_gets_the_logits_of_a_single_step_bit_for_bit(q8_weights):
    """What keeps greedy speculation on plain decoding's reply: a near-tie (a top-2 gap under
    1 comes every few dozen tokens) goes the same way in a verify as in plain decoding's step
    only if the logits are the same bits. With the plain attention kernel they were 0.3-0.9
    apart from the first token; with flash attention over an F16 cache, once the context
    passed 256 cells on two threads or more. Hence 300 tokens of context and two threads."""
    rng = random.Random(0)
    context = [rng.randrange(200, 40000) for _ in range(300)]
    drafts = [rng.randrange(200, 40000) for _ in range(6)]
    stepped = LlamaCppRuntime(q8_weights, 1024, threads=2)
    verified = LlamaCppRuntime(q8_weights, 1024, threads=2)
    try:
        stepped.forward(context)
        step_logits = torch.cat([stepped.forward([token]) for token in drafts])
        verified.forward(context)
        verify_logits = verified.forward(drafts, logits_wanted=len(drafts))
        for row in range(len(drafts)):
            assert torch.equal(verify_logits[row], step_logits[row]), (row, (verify_logits[row] - step_logits[row]).abs().max())
    finally:
        stepped.close()
        verified.close()


def test_greedy_chain_replies_to_held_out_prompts_equal_plain_decoding_on_llamacpp(demo_target_path):
    """The demo target at the precision chats run it (Q8_0), drafting for itself so that
    every round verifies a long chain: the reply must be plain decoding's, near-ties and all."""
    from engine.prompts import CHAT_PROMPTS, read_prompts

    target = load_model(ModelSpec("demo-target"), runtime="llama.cpp")
    draft = load_model(ModelSpec("demo-target"), runtime="llama.cpp", as_draft=True)
    pair = LoadedPair(PairConfig("self", ModelSpec("demo-target"), ModelSpec("demo-target")), target, draft)
    try:
        for prompt in read_prompts(CHAT_PROMPTS)[:PROMPTS_CHECKED]:
            replies = {}
            for method in ("ar", "chain"):
                settings = DecodeSettings(method=method, max_new_tokens=160, draft_tokens=6)
                replies[method] = list(pair.generate([Message("user", prompt)], settings))[-1].token_ids
            assert replies["chain"] == replies["ar"], prompt
    finally:
        pair.close()

"""The static runtime beyond Llama: each family's recipe gives the eager model's logits.

Every model here is tiny, random and built from its transformers config, with a sliding
window of a few tokens, so that chunked prompts, chains, token trees and kept paths all
cross it. The reference is the eager model run afresh over the whole sequence (the eager
runtime's cache cannot run trees over sliding layers, nor crop them once full).
"""
from __future__ import annotations

import random

import pytest
import torch
from transformers import (
    Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel, MistralConfig,
    MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
)

from engine.chat_prompt import Message
from engine.config import DecodeSettings
from engine.runtime.int8_weights import quantise_weight_only
from engine.runtime import rms_norm_cuda
from engine.runtime.rms_norm_cuda import LLAMA_STYLE_NORMS
from engine.runtime.static_families import static_refusal
from engine.runtime.torch_eager import TorchRuntime
from engine.runtime.forward_plan import ForwardSettings, plan_forward
from engine.runtime.torch_load import torch_runtime_factory
from engine.runtime.torch_static import BUCKETS, StaticTorchRuntime
from engine.tree import TokenTree, forward_tree, keep_path

from .test_torch_static import tiny_pair

VOCAB = 64
WINDOW = 6  # sliding window: every conversation below is many windows long
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
SHAPE = {
    "vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": False,
    # larger weights than the default 0.02, so that attention is far from uniform and the soft caps bite
    "initializer_range": 0.2,
}
FAMILIES = {
    # Qwen2 and Qwen3 slide from layer max_window_layers on
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "qwen3": lambda: Qwen3ForCausalLM(
        Qwen3Config(**SHAPE, head_dim=8, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    ),
    # every Phi-3 layer slides; half of each head is rotated (Phi-4-mini rotates three quarters)
    "phi3": lambda: Phi3ForCausalLM(
        Phi3Config(**SHAPE, sliding_window=WINDOW, partial_rotary_factor=0.5, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    ),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=WINDOW)),
    # transformers' SDPA attention skips Gemma 2's attention soft cap; its eager attention applies it
    "gemma2": lambda: Gemma2ForCausalLM(
        Gemma2Config(
            **SHAPE, head_dim=8, query_pre_attn_scalar=12, sliding_window=WINDOW, layer_types=LAYER_TYPES,
            attn_logit_softcapping=1.0, final_logit_softcapping=8.0, attn_implementation="eager",
        )
    ),
    # local layers rotate with their own base; the global ones with linear scaling on another
    "gemma3": lambda: Gemma3ForCausalLM(
        Gemma3TextConfig(
            **SHAPE, head_dim=8, query_pre_attn_scalar=12, sliding_window=WINDOW, layer_types=LAYER_TYPES,
            final_logit_softcapping=8.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            },
        )
    ),
}


def tiny(family: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of `family` whose norms are random too (at their initial ones or
    zeros a forgotten norm would go unnoticed)."""
    torch.manual_seed(seed)
    model = FAMILIES[family]().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0.0, 0.5)
    return model


def static(model, capacity: int = 400) -> StaticTorchRuntime:
    return StaticTorchRuntime(model, torch.device("cpu"), capacity, graphs=False)


def eager_logits(model, tokens: list[int], wanted: int = 1) -> torch.Tensor:
    """The eager runtime's logits for the last `wanted` of `tokens`, run afresh."""
    return TorchRuntime(model, torch.device("cpu")).forward(tokens, logits_wanted=wanted)


def deep_tree(rng: random.Random, root: int, size: int) -> TokenTree:
    """A tree that branches but mostly grows deeper: each node follows one of the last two,
    so it is at least size / 2 deep."""
    tokens, parents = [root], [-1]
    while len(tokens) <= size:
        parent = rng.randrange(max(0, len(tokens) - 2), len(tokens))
        taken = {tokens[node] for node in range(len(tokens)) if parents[node] == parent}
        tokens.append(rng.choice([token for token in range(VOCAB) if token not in taken]))
        parents.append(parent)
    return TokenTree(tokens, parents)


def assert_same(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_static_logits_equal_the_eager_ones_through_prompts_trees_kept_paths_and_chains(family):
    rng = random.Random(family)
    model = tiny(family)
    runtime = static(model)
    # 1. a prompt longer than the widest bucket, so it runs in chunks, many windows long
    context = [rng.randrange(VOCAB) for _ in range(2 * BUCKETS[-1] + 9)]
    wanted = BUCKETS[-1] + 5  # the wanted rows span two chunks
    assert_same(runtime.forward(context, logits_wanted=wanted), eager_logits(model, context, wanted))
    for _ in range(3):
        # 2. a tree deeper than the window: a deep node's window holds only its own ancestors
        tree = deep_tree(rng, context[-1], rng.randrange(2 * WINDOW + 2, 4 * WINDOW))
        assert tree.depth > WINDOW
        logits = forward_tree(runtime, context, tree)
        for node in range(len(tree)):
            path_tokens = [tree.tokens[step] for step in tree.path(node)]
            assert_same(logits[node : node + 1], eager_logits(model, context + path_tokens))
        # 3. keep one path (its keys move to the front of the tree's slots), then run a chain after it
        deepest = max(range(len(tree)), key=lambda node: (tree.depths[node], rng.random()))
        path = tree.path(deepest if rng.random() < 0.5 else rng.randrange(len(tree)))
        keep_path(runtime, len(context), path)
        context = context + [tree.tokens[node] for node in path]
        following = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 5))]
        context += following
        assert_same(runtime.forward(following, logits_wanted=len(following)), eager_logits(model, context, len(following)))
        # 4. an edit of the conversation: crop back, then go on
        context = context[: rng.randrange(len(context) - 8, len(context))]
        runtime.crop(len(context) - 1)
        assert_same(runtime.forward(context[-1:]), eager_logits(model, context))
        assert runtime.cached_ids == context


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "qwen3", "phi3"])
def test_each_recipe_step_changes_the_logits(family):
    """The steps a recipe adds are not no-ops on these tiny models, so the test above sees a
    forgotten one: without its sliding window, or its caps, a family's logits move."""
    model = tiny(family)
    rng = random.Random(1)
    context = [rng.randrange(VOCAB) for _ in range(3 * WINDOW)]
    expected = eager_logits(model, context, 4)
    runtime = static(model)
    runtime.forward_pass.sliding_windows = [None] * len(runtime.forward_pass.sliding_windows)
    assert (runtime.forward(context, logits_wanted=4) - expected).abs().max() > 1e-2
    if family in ("gemma2", "gemma3"):
        runtime = static(model)
        runtime.forward_pass.logit_cap = None
        runtime.forward_pass.attention_cap = None
        assert (runtime.forward(context, logits_wanted=4) - expected).abs().max() > 1e-2


@pytest.mark.parametrize("family", ["gemma3", "qwen3"])
def test_greedy_chain_and_tree_equal_plain_decoding_across_the_window(make_word_tokenizer, family):
    """The target drafts for itself through a second cache, so every round verifies long
    chains and trees across the window, and any slip in a window shows in the reply."""
    pair = tiny_pair(make_word_tokenizer, lambda model: static(model, capacity=200), model=tiny(family, seed=3))
    replies = {}
    for method in ("ar", "chain", "tree"):
        settings = DecodeSettings(method=method, max_new_tokens=40, tree_shape="8x4" if method == "tree" else "auto")
        events = list(pair.generate([Message("user", "w1 w2 w3")], settings))
        replies[method] = events[-1].token_ids
        if method != "ar":
            assert events[-1].stats.target_calls < len(replies[method])  # drafts were accepted
    assert len(replies["ar"]) == 40
    assert replies["chain"] == replies["tree"] == replies["ar"]


def test_weight_only_int8_keeps_gemmas_embedding_scale():
    model = tiny("gemma3")
    ids = [5, 9, 11, 40, 2, 7, 33]
    reference = eager_logits(model, ids, len(ids))
    quantise_weight_only(model)
    quantised = eager_logits(model, ids, len(ids))
    assert (quantised - reference).abs().max() <= 0.05 * reference.abs().max()  # rounded, not rescaled
    # The CPU's int8 layers round their activations too, so a last-bit difference between
    # the runtimes' attention can move a logit by a step of the activations' second rounding.
    static_logits = static(model).forward(ids, logits_wanted=len(ids))
    assert (static_logits - quantised).abs().max() <= 1e-3 * quantised.abs().max()


def longrope_phi3() -> Phi3ForCausalLM:
    factors = [1.0, 1.5, 2.0, 3.0]  # one per rotated pair of a head's 8 dimensions
    rope = {
        "rope_type": "longrope", "rope_theta": 10_000.0, "short_factor": factors, "long_factor": factors[::-1],
        "original_max_position_embeddings": 64,
    }
    config = Phi3Config(**SHAPE, rope_parameters=rope, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return Phi3ForCausalLM(config).eval()


def tiny_gpt2() -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)).eval()


@pytest.mark.parametrize(
    ("make_model", "reason"),
    [(longrope_phi3, "'longrope' rotary embedding switches frequencies by the longest position"), (tiny_gpt2, "no static-cache recipe for 'gpt2'")],
)
def test_a_model_the_static_runtime_cannot_run_exactly_says_why_and_runs_eagerly(make_model, reason):
    model = make_model()
    assert reason in static_refusal(model)
    with pytest.raises(ValueError, match="cannot run this model"):
        static(model)
    cuda = torch.device("cuda")  # neither call touches the GPU: they only choose
    plan = plan_forward(model, cuda, ForwardSettings.for_pair(compile=False))
    assert plan.name == f"torch (no CUDA graphs: {static_refusal(model)})"
    assert isinstance(torch_runtime_factory(model, cuda, 64, plan)(False), TorchRuntime)


def test_every_new_family_runs_static():
    for family in FAMILIES:
        model = tiny(family)
        assert static_refusal(model) is None, family
        assert plan_forward(model, torch.device("cuda")).name == "torch + CUDA graphs"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("family", ["gemma2", "gemma3", "phi3"])
def test_replayed_graphs_of_the_new_families_give_the_uncaptured_logits(family):
    rng = random.Random(0)
    model = tiny(family).to("cuda", torch.bfloat16)
    captured, uncaptured = (StaticTorchRuntime(model, torch.device("cuda"), 600, graphs=graphs) for graphs in (True, False))
    captured.warm_up()
    assert captured.cuda_graphs.enabled, captured.cuda_graphs.failure
    context = [rng.randrange(VOCAB) for _ in range(150)]
    results = [runtime.forward(context, logits_wanted=2) for runtime in (captured, uncaptured)]
    assert torch.equal(results[0], results[1])
    for _ in range(3):
        tree = deep_tree(rng, context[-1], 20)
        results = [forward_tree(runtime, context, tree) for runtime in (captured, uncaptured)]
        assert torch.equal(results[0], results[1])
        path = tree.path(len(tree) - 1)
        for runtime in (captured, uncaptured):
            keep_path(runtime, len(context), path)
        context = context + [tree.tokens[node] for node in path]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused norms run on a CUDA GPU")
@pytest.mark.parametrize("family", FAMILIES)
def test_a_gpus_captured_forward_with_fused_norms_gives_the_eager_logits(family):
    """On a GPU the Llama-style norms are Triton kernels (rms_norm_cuda.py), the others stay
    transformers' own: either way, at fp32, the logits are the eager model's on the CPU."""
    rng = random.Random(family)
    model = tiny(family)
    context = [rng.randrange(VOCAB) for _ in range(3 * WINDOW + 5)]
    tree = deep_tree(rng, context[-1], 2 * WINDOW)
    expected_chain = eager_logits(model, context, 4)
    expected_tree = [eager_logits(model, context + [tree.tokens[step] for step in tree.path(node)]) for node in range(len(tree))]
    gpu_model = model.to("cuda")
    runtime = StaticTorchRuntime(gpu_model, torch.device("cuda"), 400)
    norm = gpu_model.model.layers[0].input_layernorm
    fused = runtime.forward_pass.norms[0]["input_layernorm"] is not norm
    assert fused == (type(norm).__name__ in LLAMA_STYLE_NORMS and rms_norm_cuda.failure(torch.device("cuda")) is None), family
    torch.testing.assert_close(runtime.forward(context, logits_wanted=4).cpu(), expected_chain, rtol=1e-3, atol=1e-3)
    logits = forward_tree(runtime, context, tree).cpu()
    for node in range(len(tree)):
        torch.testing.assert_close(logits[node : node + 1], expected_tree[node], rtol=1e-3, atol=1e-3)
    assert runtime.cuda_graphs.enabled, runtime.cuda_graphs.failure

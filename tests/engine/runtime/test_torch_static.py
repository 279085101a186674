"""The static-cache torch runtime (graph-captured on CUDA) against the eager one.

On the CPU the same static forward runs uncaptured: its cache writes, tree masks, padding,
chunking and compaction must give the eager runtime's logits. Graph replay itself is checked
against the uncaptured forward where a CUDA GPU is present.
"""
from __future__ import annotations

import gc
import random
import weakref

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.chat_prompt import Message
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.runtime import int8_cuda, int8_kernel
from engine.runtime.int8_weights import Int8Linear, quantise_weight_only, weight_bytes
from engine.models import LoadedModel
from engine.runtime.static_families import static_refusal
from engine.runtime.torch_eager import TorchRuntime
from engine.runtime.torch_static import BUCKETS, SCRATCH_ROWS, WARM_WINDOWS, StaticTorchRuntime, runs_static
from engine.session import LoadedPair
from engine.tree import TokenTree, forward_tree, keep_path

from ..tiny_models import WORDS, TEMPLATE, tiny_llama

VOCAB = 64
TOLERANCE = 1e-4


def static(model, capacity=400, device="cpu", graphs=False) -> StaticTorchRuntime:
    return StaticTorchRuntime(model, torch.device(device), capacity, graphs=graphs)


def eager(model) -> TorchRuntime:
    return TorchRuntime(model, torch.device("cpu"))


def random_tree(rng: random.Random, root: int, size: int) -> TokenTree:
    tokens, parents = [root], [-1]
    for _ in range(size):
        parent = rng.randrange(len(tokens))
        taken = {tokens[node] for node in range(len(tokens)) if parents[node] == parent}
        token = rng.choice([t for t in range(VOCAB) if t not in taken])
        tokens.append(token)
        parents.append(parent)
    return TokenTree(tokens, parents)


@pytest.mark.parametrize("seed", range(4))
def test_static_cache_gives_the_eager_logits_through_chains_trees_and_kept_paths(seed):
    rng = random.Random(seed)
    model = tiny_llama(seed=seed, vocab_size=VOCAB)
    runtimes = (eager(model), static(model))
    context = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 20))]
    first = [runtime.forward(context, logits_wanted=3) for runtime in runtimes]
    assert torch.allclose(first[0], first[1], atol=TOLERANCE)
    converse(rng, runtimes, context, rounds=4, same=lambda a, b: torch.allclose(a, b, atol=TOLERANCE))


def converse(rng: random.Random, runtimes, context: list[int], rounds: int, same) -> None:
    """Run two runtimes through the same random conversation after `context` and check that
    `same(logits of one, logits of the other)` at every forward: a random tree, one of its
    paths kept, a few plain tokens, then a crop to a random length."""
    for _ in range(rounds):
        tree = random_tree(rng, context[-1], rng.randrange(1, 12))
        assert same(*[forward_tree(runtime, context, tree) for runtime in runtimes])
        path = tree.path(rng.randrange(len(tree)))
        for runtime in runtimes:
            keep_path(runtime, len(context), path)
        context = context + [tree.tokens[node] for node in path]
        following = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 4))]
        assert same(*[runtime.forward(following, logits_wanted=len(following)) for runtime in runtimes])
        context += following
        cut = rng.randrange(1, len(context))
        for runtime in runtimes:
            runtime.crop(cut)
        context = context[:cut]
        assert runtimes[0].cached_ids == runtimes[1].cached_ids == context


def test_a_forward_longer_than_the_widest_bucket_runs_in_chunks():
    model = tiny_llama(seed=7, vocab_size=VOCAB)
    prompt = [random.Random(1).randrange(VOCAB) for _ in range(3 * BUCKETS[-1] + 13)]  # past the first key window
    wanted = BUCKETS[-1] + 20  # spans the last two chunks
    expected = eager(model).forward(prompt, logits_wanted=wanted)
    got = static(model).forward(prompt, logits_wanted=wanted)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=TOLERANCE)


def test_a_full_context_is_a_clear_error_that_keeps_the_cache():
    model = tiny_llama(seed=1, vocab_size=VOCAB)
    runtime = static(model, capacity=16)
    runtime.forward(list(range(10)))
    with pytest.raises(ValueError, match="context is full"):
        runtime.forward(list(range(10)))
    with pytest.raises(ValueError, match="context is full"):
        runtime.forward_tree(list(range(7)), [9, 10, 10, 12, 9, 14, 15], logits_wanted=7)
    assert runtime.cached_ids == list(range(10))  # checked before running: nothing was lost
    # and the cache still works: the next tokens see the same context the eager runtime does
    expected = eager(model).forward(list(range(10)) + [1, 2, 3], logits_wanted=3)
    assert torch.allclose(runtime.forward([1, 2, 3], logits_wanted=3), expected, atol=TOLERANCE)


@torch.no_grad()
def test_hidden_states_are_what_the_lm_head_read_and_the_eager_ones():
    model = tiny_llama(seed=4, vocab_size=VOCAB)
    runtime = StaticTorchRuntime(model, torch.device("cpu"), 400, graphs=False, hidden_states=True)
    reference = TorchRuntime(model, torch.device("cpu"), hidden_states=True)
    assert runtime.returns_hidden
    prompt = [random.Random(2).randrange(VOCAB) for _ in range(BUCKETS[-1] + 10)]
    steps = [
        lambda r: r.forward(prompt, logits_wanted=15),  # chunked: the wanted rows span two chunks
        lambda r: r.forward([1, 2, 3], logits_wanted=2),
        lambda r: r.forward_tree([5, 6, 7], [len(prompt) + 1, len(prompt) + 1, len(prompt) + 3], logits_wanted=3),
    ]
    for step in steps:
        logits = step(runtime)
        hidden = runtime.last_hidden_states()
        assert hidden.dtype == torch.float32 and hidden.shape == (len(logits), model.config.hidden_size)
        torch.testing.assert_close(model.lm_head(hidden), logits, rtol=1e-5, atol=1e-5)
        step(reference)
        torch.testing.assert_close(hidden, reference.last_hidden_states(), rtol=1e-4, atol=1e-4)


def test_a_static_runtime_without_hidden_states_says_so():
    runtime = static(tiny_llama(seed=1, vocab_size=VOCAB))
    runtime.forward([1, 2])
    with pytest.raises(ValueError, match="without hidden states"):
        runtime.last_hidden_states()


def test_a_tree_wider_than_the_widest_bucket_runs_in_chunks():
    rng = random.Random(5)
    model = tiny_llama(seed=8, vocab_size=VOCAB)
    runtimes = (eager(model), static(model))
    context = [rng.randrange(VOCAB) for _ in range(30)]
    for runtime in runtimes:
        runtime.forward(context[:-1])
    tree = random_tree(rng, context[-1], 2 * BUCKETS[-1] + 9)  # later chunks see branches of earlier ones
    logits = [forward_tree(runtime, context, tree) for runtime in runtimes]
    assert logits[1].shape == (len(tree), VOCAB)
    assert torch.allclose(logits[0], logits[1], atol=TOLERANCE)
    path = tree.path(len(tree) - 1)
    for runtime in runtimes:
        keep_path(runtime, len(context), path)
    following = [3, 1, 4]
    logits = [runtime.forward(following, logits_wanted=3) for runtime in runtimes]
    assert torch.allclose(logits[0], logits[1], atol=TOLERANCE)


class GraphStandIn:
    """What the capture path gets on the CPU instead of a CUDA graph: `replay` runs the forward
    again and writes the results into the outputs made at "capture", as a replayed graph
    rewrites its static outputs in place."""

    def __init__(self, forward):
        self.forward = forward
        self.outputs = forward()

    def replay(self) -> None:
        for static_output, fresh in zip(self.outputs, self.forward()):
            static_output.copy_(fresh)


def record_on_the_cpu(runtime: StaticTorchRuntime, recorded: list, fails=lambda bucket, window: False):
    """Stand-in for `_record`, the capture's only CUDA step; `fails` picks shapes that fail."""

    def record(bucket, window):
        if fails(bucket, window):
            raise RuntimeError("operation not permitted when stream is capturing")
        # a capture runs on padding alone: each token writing its own scratch row, seeing itself
        assert runtime.rows[:bucket].tolist() == list(range(bucket))
        assert torch.equal(runtime.visible[:bucket, :bucket], torch.eye(bucket, dtype=torch.bool))
        recorded.append((bucket, window))
        graph = GraphStandIn(lambda: runtime._forward(bucket, window))
        return graph, graph.outputs

    return record


def graphed(model, recorded: list, capacity=1200, **fails) -> StaticTorchRuntime:
    runtime = StaticTorchRuntime(model, torch.device("cpu"), capacity, graphs=True, hidden_states=True)
    runtime.cuda_graphs._record = record_on_the_cpu(runtime, recorded, **fails)
    return runtime


@pytest.mark.parametrize("warm", [True, False])
def test_graphs_captured_at_warm_up_or_first_use_replay_the_eager_logits(warm):
    rng = random.Random(3)
    model = tiny_llama(seed=6, vocab_size=VOCAB)
    recorded = []
    runtime, reference = graphed(model, recorded), TorchRuntime(model, torch.device("cpu"), hidden_states=True)
    if warm:
        runtime.warm_up()
        warm_windows = [window for window in runtime.windows if window <= WARM_WINDOWS]
        assert recorded == [(bucket, window) for window in warm_windows for bucket in BUCKETS]
    else:
        assert recorded == []
    context = [rng.randrange(VOCAB) for _ in range(WARM_WINDOWS - SCRATCH_ROWS + 40)]  # its last chunk needs a wider window
    logits = [r.forward(context, logits_wanted=3) for r in (runtime, reference)]
    assert (BUCKETS[-1], runtime.windows[-1]) in recorded  # captured at first use, mid-forward
    assert torch.allclose(logits[0], logits[1], atol=TOLERANCE)
    assert torch.allclose(runtime.last_hidden_states(), reference.last_hidden_states(), atol=TOLERANCE)
    kept = logits[0].clone()
    for _ in range(3):
        tree = random_tree(rng, context[-1], rng.randrange(1, 12))
        results = [forward_tree(r, context, tree) for r in (runtime, reference)]
        assert torch.allclose(results[0], results[1], atol=TOLERANCE)
        assert torch.allclose(runtime.last_hidden_states(), reference.last_hidden_states(), atol=TOLERANCE)
        path = tree.path(rng.randrange(len(tree)))
        for r in (runtime, reference):
            keep_path(r, len(context), path)
        context = context + [tree.tokens[node] for node in path]
    assert torch.equal(logits[0], kept)  # what a forward returned is a copy, not the graph's output


def test_a_capture_that_fails_at_warm_up_leaves_the_uncaptured_forward():
    model = tiny_llama(seed=6, vocab_size=VOCAB)
    runtime = graphed(model, [], fails=lambda bucket, window: True)
    with pytest.warns(RuntimeWarning, match="capture failed"):
        runtime.warm_up()  # and the load goes on
    assert not runtime.cuda_graphs.enabled and runtime.cuda_graphs.captured == {} and runtime.cuda_graphs.pool is None
    assert "not permitted when stream is capturing" in runtime.cuda_graphs.failure
    assert runtime.name == "torch (static cache)"
    expected = eager(model).forward([1, 2, 3], logits_wanted=3)
    assert torch.allclose(runtime.forward([1, 2, 3], logits_wanted=3), expected, atol=TOLERANCE)


def test_a_capture_that_fails_mid_conversation_still_gives_that_forward_right():
    rng = random.Random(4)
    model = tiny_llama(seed=6, vocab_size=VOCAB)
    recorded = []
    runtime = graphed(model, recorded, fails=lambda bucket, window: window > WARM_WINDOWS)
    runtime.warm_up()
    assert runtime.cuda_graphs.enabled
    context = [rng.randrange(VOCAB) for _ in range(WARM_WINDOWS - SCRATCH_ROWS + 40)]
    with pytest.warns(RuntimeWarning, match="capture failed"):
        logits = runtime.forward(context, logits_wanted=5)  # the failed capture had parked its inputs
    assert not runtime.cuda_graphs.enabled and runtime.cuda_graphs.captured == {}
    assert torch.allclose(logits, eager(model).forward(context, logits_wanted=5), atol=TOLERANCE)
    assert runtime.cached_ids == context


def test_close_frees_the_graphs_and_the_cache():
    recorded = []
    runtime = graphed(tiny_llama(seed=6, vocab_size=VOCAB), recorded)
    runtime.forward([1, 2, 3])
    cache = weakref.ref(runtime.forward_pass.cache[0][0])
    graph_output = weakref.ref(runtime.cuda_graphs.captured[recorded[0]][1][0])
    runtime.close()
    gc.collect()
    assert cache() is None and graph_output() is None
    assert runtime.cuda_graphs.captured == {} and runtime.cuda_graphs.pool is None
    with pytest.raises(ValueError, match="closed"):
        runtime.forward([4])
    runtime.close()  # twice is harmless


def tiny_pair(make_word_tokenizer, runtime_factory, model=None) -> LoadedPair:
    """A tiny target (a Llama unless `model` is given) that drafts for itself through a
    second cache: every draft is right, so rounds verify long chains and trees, and any slip
    in the cache shows in the output."""
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    model = tiny_llama(seed=3, vocab_size=VOCAB) if model is None else model

    def loaded() -> LoadedModel:
        return LoadedModel(
            model, tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=200,
            runtime_factory=lambda hidden_states, feature_layers=(): runtime_factory(model),
        )

    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny"), ModelSpec("tiny")), loaded(), loaded())
    pair.stop_token_ids = frozenset()
    return pair


def test_greedy_chain_tree_and_staged_equal_plain_decoding_on_the_static_runtime(make_word_tokenizer):
    pair = tiny_pair(make_word_tokenizer, lambda model: static(model, capacity=200))
    replies = {}
    for method in ("ar", "chain", "tree", "staged"):
        shape = "8x4" if method in ("tree", "staged") else "auto"
        settings = DecodeSettings(method=method, max_new_tokens=40, tree_shape=shape)
        events = list(pair.generate([Message("user", "w1 w2 w3")], settings))
        replies[method] = events[-1].token_ids
        if method != "ar":
            assert events[-1].stats.target_calls < len(replies[method])  # drafts were accepted
    assert len(replies["ar"]) == 40
    assert replies["chain"] == replies["tree"] == replies["staged"] == replies["ar"]


def test_weight_only_int8_keeps_the_logits_close_in_half_the_memory():
    model = tiny_llama(seed=5, vocab_size=VOCAB, hidden=64)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as SmolLM2's are
    ids = torch.tensor([[5, 9, 11, 40, 2]])
    with torch.no_grad():
        reference = model(ids).logits[0]
    before = weight_bytes(model)
    quantise_weight_only(model)
    with torch.no_grad():
        quantised = model(ids).logits[0]
    assert weight_bytes(model) <= 0.3 * before  # fp32 -> int8 plus one scale per row
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # one shared table
    error = (quantised - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.02  # rounded, and only slightly
    # and the static runtime runs it: its layers are plain tensor ops (on the CPU in the native
    # forward, whose bf16 attention build rounds attention's inputs to bf16's 8 significant bits)
    assert runs_static(model)
    tolerance = 1e-2 * float(quantised.abs().max()) if int8_kernel.attention_in_bf16() else TOLERANCE
    assert torch.allclose(static(model).forward(ids[0].tolist(), logits_wanted=5), quantised, atol=tolerance)


def tiny_llama_with_biases(seed: int) -> LlamaForCausalLM:
    """A tiny Llama whose projections and untied LM head all carry (nonzero) biases."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        head = torch.nn.Linear(config.hidden_size, VOCAB, bias=True)
        head.weight.copy_(model.lm_head.weight * 20.0)  # sharp logits, as tiny_llama's
        head.bias.normal_(0, 1.0)
        model.lm_head = head
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None and module is not head:
                module.bias.normal_(0, 0.2)
    return model


def test_weight_only_int8_of_a_bf16_model_with_biases_and_an_untied_head():
    model = tiny_llama_with_biases(seed=5)
    ids = [5, 9, 11, 40, 2, 7, 33]
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0]  # float32
    model.to(torch.bfloat16)  # what int8-wo loads before quantising
    quantise_weight_only(model)
    head = model.get_output_embeddings()
    assert isinstance(head, Int8Linear) and head.bias is not None
    assert head.scale.dtype == model.get_input_embeddings().scale.dtype == torch.float32
    with torch.no_grad():
        quantised = model(torch.tensor([ids])).logits[0]
    assert quantised.dtype == torch.bfloat16  # computed in the activations' dtype all along
    error = (quantised.float() - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.03  # int8 rounding on top of bf16's
    eager_logits = eager(model).forward(ids, logits_wanted=len(ids))
    static_logits = static(model).forward(ids, logits_wanted=len(ids))
    assert (static_logits - eager_logits).abs().max() <= 0.01 * eager_logits.abs().max()  # bf16 noise


def test_bitsandbytes_models_stay_on_the_eager_runtime():
    model = tiny_llama(seed=1, vocab_size=VOCAB)
    assert runs_static(model)
    model.is_loaded_in_8bit = True  # bitsandbytes' layers cannot be captured
    assert not runs_static(model)
    assert "bitsandbytes" in static_refusal(model)


@pytest.mark.parametrize(
    ("rope_type", "static_ok"), [("default", True), ("linear", True), ("llama3", True), ("dynamic", False)]
)
def test_only_rotary_embeddings_with_fixed_frequencies_run_static(rope_type, static_ok):
    rope = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 2.0}
    if rope_type == "llama3":
        rope |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rope_parameters=rope,
    )
    # "dynamic" recomputes its frequencies from each call's positions: no graph can hold that
    assert runs_static(LlamaForCausalLM(config)) == static_ok


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8-wo"])
def test_replayed_graphs_give_the_uncaptured_forward_logits(precision):
    """int8-wo: each int8 layer is a Triton kernel (int8_cuda.py), captured like the rest."""
    rng = random.Random(0)
    model = tiny_llama(seed=2, vocab_size=VOCAB).to("cuda", torch.float32 if precision == "fp32" else torch.bfloat16)
    if precision == "int8-wo":
        quantise_weight_only(model)
        assert int8_cuda.failure(torch.device("cuda"), torch.bfloat16) is None  # the layers take the kernel
    captured, uncaptured = (
        StaticTorchRuntime(model, torch.device("cuda"), 1200, graphs=graphs, hidden_states=True) for graphs in (True, False)
    )
    captured.warm_up()
    assert captured.cuda_graphs.enabled, captured.cuda_graphs.failure
    assert {bucket for bucket, _ in captured.cuda_graphs.captured} == set(BUCKETS)
    context = [rng.randrange(VOCAB) for _ in range(200)]  # and the trees cross into a wider key window
    results = [runtime.forward(context, logits_wanted=2) for runtime in (captured, uncaptured)]
    assert torch.equal(results[0], results[1])
    for _ in range(5):
        tree = random_tree(rng, context[-1], rng.randrange(1, 40))
        results = [forward_tree(runtime, context, tree) for runtime in (captured, uncaptured)]
        assert results[0].shape == (len(tree), VOCAB)
        assert torch.equal(results[0], results[1])
        assert torch.equal(captured.last_hidden_states(), uncaptured.last_hidden_states())
        path = tree.path(rng.randrange(len(tree)))
        for runtime in (captured, uncaptured):
            keep_path(runtime, len(context), path)
        context = context + [tree.tokens[node] for node in path]
    # past the windows captured at warm-up: the widest is captured mid-forward, at first use
    more = [rng.randrange(VOCAB) for _ in range(WARM_WINDOWS - len(context))]
    results = [runtime.forward(more, logits_wanted=3) for runtime in (captured, uncaptured)]
    assert (BUCKETS[-1], captured.windows[-1]) in captured.cuda_graphs.captured and captured.cuda_graphs.enabled
    assert torch.equal(results[0], results[1])
    assert torch.equal(captured.last_hidden_states(), uncaptured.last_hidden_states())
    in_use = torch.cuda.memory_allocated()
    cache_bytes = captured.forward_pass.cache_bytes
    captured.close()
    assert torch.cuda.memory_allocated() <= in_use - cache_bytes  # the cache and the graphs' outputs went

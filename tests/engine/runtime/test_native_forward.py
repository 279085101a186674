"""The native forward (decoder_forward.c) against the static runtime's torch forward over the
same int8 model: chains, trees, kept paths, chunked prompts, features and hidden states, and
what it refuses.

Its products are the torch forward's floats, but its norms and attention sum in another order,
so its logits agree to float32 rounding, not to the bit: within RELATIVE of the largest logit
(BF16_RELATIVE for a build whose attention multiplies in bf16). A wrong rotation, mask or cache
row is off by whole units.
"""
from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from engine.runtime import int8_kernel
from engine.runtime.cpu import cpu_flags
from engine.runtime.int4_weights import Int4Linear
from engine.runtime.int8_weights import quantise_weight_only
from engine.runtime.forward_plan import ForwardSettings, plan_forward
from engine.runtime.native_forward import NATIVE_NAME, NativeForward, refusal
from engine.runtime.torch_load import torch_runtime_factory
from engine.runtime.static_cache_forward import StaticCacheForward
from engine.runtime.torch_static import SCRATCH_ROWS, StaticTorchRuntime
from engine.tree import TokenTree, forward_tree, keep_path

from .test_torch_static import converse, random_tree

pytestmark = pytest.mark.skipif(int8_kernel.unavailable_reason() is not None,
                                reason=f"the int8 kernel does not run here: {int8_kernel.unavailable_reason()}")

# Every kernel build, skipped with the CPU flags it needs and this CPU lacks (the portable one runs everywhere).
ALL_VARIANTS = [
    pytest.param(variant, id=variant.name, marks=pytest.mark.skipif(
        not variant.needs <= cpu_flags(),
        reason=f"this CPU lacks {', '.join(sorted(variant.needs - cpu_flags()))} for the {variant.name} build"))
    for variant in int8_kernel.VARIANTS
]
VOCAB = 64
# The key rows of one attention range (decoder_forward.c's RANGE_ROWS): tests place tokens across
# a range's border (0 where the library is missing and every test here is skipped).
RANGE = int8_kernel.attention_range_rows() or 0
CAPACITY = RANGE + 200  # the runtimes' tokens
RELATIVE = 2e-4
# The AVX-512 BF16 build rounds the attention's queries, keys, values and weights to bf16 (8
# significant bits): measured within 4e-3 of the largest logit on these models.
BF16_RELATIVE = 1e-2
INT4_RELATIVE = 6e-2  # test_an_int4_model_runs_natively_and_gives_the_torch_logits says why
SHAPE = {
    "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": False, "initializer_range": 0.1,
}
MODELS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE)),
    # Llama 3's scaled rotary frequencies: the native forward reads them from the model's own module
    "llama3-rope": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64, "rope_theta": 500_000.0,
    })),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SHAPE)),  # biases on q, k and v
    # an RMSNorm on each query and key head, and heads wider than hidden / heads
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=24)),
    # heads of 96: on AVX-512 attention sums 64 value columns in registers and the other 32 in
    # its plain loop
    "llama-96-wide-heads": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, head_dim=96)),
    # heads of 18: 9 element pairs, which the bf16 build's scores (4 sums of pairs) split unevenly
    "llama-18-wide-heads": lambda: LlamaForCausalLM(LlamaConfig(**SHAPE, head_dim=18)),
}


def int8_model(kind: str, seed: int, bits: int = 8) -> torch.nn.Module:
    torch.manual_seed(seed)
    return quantised(MODELS[kind](), bits)


def quantised(model: torch.nn.Module, bits: int = 8) -> torch.nn.Module:
    """`model` with random norms and biases and sharp logits, its weights in int8 (or int4:
    int4_weights.py)."""
    model = model.eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(1.0, 0.3)  # random norms: a forgotten one would show
            elif name.endswith("bias"):
                parameter.normal_(0.0, 0.3)
        model.lm_head.weight.mul_(10.0)  # sharp logits, far from uniform
    return quantise_weight_only(model, bits)


def pair_of_runtimes(model, **options) -> tuple[StaticTorchRuntime, StaticTorchRuntime]:
    """(native, torch): the same static runtime with and without the native forward."""
    native = StaticTorchRuntime(model, torch.device("cpu"), CAPACITY, **options)
    torch_only = StaticTorchRuntime(model, torch.device("cpu"), CAPACITY, native=False, **options)
    assert native.native is not None and native.name == NATIVE_NAME
    return native, torch_only


def close(native: torch.Tensor, reference: torch.Tensor, bf16_attention: bool | None = None) -> bool:
    """Whether native is within tolerance of reference: the build that ran native's, by default
    the one loaded now."""
    bf16 = int8_kernel.attention_in_bf16() if bf16_attention is None else bf16_attention
    relative = BF16_RELATIVE if bf16 else RELATIVE
    return native.shape == reference.shape and bool((native - reference).abs().max() <= relative * reference.abs().max())


def assert_close(native: torch.Tensor, reference: torch.Tensor, bf16_attention: bool | None = None) -> None:
    assert close(native, reference, bf16_attention), (native - reference).abs().max()


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("seed", range(2))
def test_native_forward_gives_the_torch_logits_through_chains_trees_and_kept_paths(kind, seed):
    rng = random.Random(seed)
    runtimes = pair_of_runtimes(int8_model(kind, seed))
    context = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 12))]
    assert close(*[runtime.forward(context, logits_wanted=3) for runtime in runtimes])
    converse(rng, runtimes, context, rounds=6, same=close)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "llama-18-wide-heads"])
def test_an_int4_model_runs_natively_and_gives_the_torch_logits(kind, each_build):
    """int4 projections (int4_weights.py; heads of 18 leave o_proj's 72 inputs in int8, and
    q's 72 rows join k and v by a copy, not in whole blocks of 16). An int4 layer rounds its
    input to int8 once per group of 32 (an int8 layer twice, to ~1/127² of its largest), so a
    difference in the last bit of the attention's sums (summed in another order here, or in bf16)
    can move a level, and a level moves the output by ~1/127 of the group's largest input: on
    these models the logits measured within 3.1e-2 of the largest in every build, where int8's
    are within 2e-4 (4e-3 with bf16 attention). INT4_RELATIVE is twice that; a wrong rotation,
    mask or cache row is off by whole units."""
    model = int8_model(kind, 3, bits=4)
    assert any(isinstance(module, Int4Linear) for module in model.modules())

    def same(native: torch.Tensor, reference: torch.Tensor) -> bool:
        return native.shape == reference.shape and bool((native - reference).abs().max() <= INT4_RELATIVE * reference.abs().max())

    rng = random.Random(3)
    runtimes = pair_of_runtimes(model)
    context = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 12))]
    assert same(*[runtime.forward(context, logits_wanted=3) for runtime in runtimes])
    converse(rng, runtimes, context, rounds=6, same=same)


def test_prompts_run_natively_in_pieces_of_64(monkeypatch):
    calls = []
    original = NativeForward.__call__
    monkeypatch.setattr(NativeForward, "__call__", lambda self, ids, *rest: calls.append(len(ids)) or original(self, ids, *rest))
    native, torch_only = pair_of_runtimes(int8_model("llama", 3))
    prompt = [random.Random(3).randrange(VOCAB) for _ in range(150)]
    assert_close(native.forward(prompt, logits_wanted=2), torch_only.forward(prompt, logits_wanted=2))
    assert calls == [64, 64, 22]
    for token in (5, 17, 40):  # steps: native over the keys either forward wrote
        assert_close(native.forward([token]), torch_only.forward([token]))
    assert calls[-3:] == [1, 1, 1]


def test_the_native_cache_holds_the_torch_keys_in_the_layout_it_names():
    """The C writes each key where key_blocks.py's layout for its build says (blocks of 16 rows on
    the bf16 build): read back through that layout, the native cache holds the torch forward's
    keys, and after a tree's kept path is moved into place, the path's keys."""
    rng = random.Random(6)
    native, torch_only = pair_of_runtimes(int8_model("llama", 6))
    context = [rng.randrange(VOCAB) for _ in range(37)]
    for runtime in (native, torch_only):
        runtime.forward(context)
    for _ in range(3):  # trees whose kept nodes move to the rows after the context
        tree = random_tree(rng, context[-1], rng.randrange(4, 15))
        for runtime in (native, torch_only):
            forward_tree(runtime, context, tree)
        path = tree.path(rng.randrange(len(tree)))
        for runtime in (native, torch_only):
            keep_path(runtime, len(context), path)
        context = context + [tree.tokens[node] for node in path]
    native_pass, torch_pass = native.forward_pass, torch_only.forward_pass
    rows = SCRATCH_ROWS + len(context)
    for (keys, _), (reference, _) in zip(native_pass.cache, torch_pass.cache):
        held = native_pass.key_layout.read(keys, rows)[:, :, SCRATCH_ROWS:].float()
        assert close(held, reference[:, :, SCRATCH_ROWS:rows].float())


@pytest.mark.parametrize("kind", ["llama", "qwen3", "llama-96-wide-heads"])
def test_trees_after_a_long_context_see_what_they_should(kind):
    """Long enough that attention takes its cache rows in blocks of 16 (AVX-512) with a tail,
    and trees whose tokens sit inside a block each see only their own ancestors there."""
    rng = random.Random(11)
    runtimes = pair_of_runtimes(int8_model(kind, 11))
    context = [rng.randrange(VOCAB) for _ in range(97)]
    assert_close(*[runtime.forward(context, logits_wanted=1) for runtime in runtimes])
    for _ in range(4):
        tree = random_tree(rng, context[-1], rng.randrange(4, 15))
        assert_close(*[forward_tree(runtime, context, tree) for runtime in runtimes])
        path = tree.path(rng.randrange(len(tree)))
        for runtime in runtimes:
            keep_path(runtime, len(context), path)
        context = context + [tree.tokens[node] for node in path]


def test_native_features_and_hidden_states_are_the_torch_ones():
    model = int8_model("qwen2", 4)
    native, torch_only = pair_of_runtimes(model, hidden_states=True, feature_layers=(2, 0, 1))
    ids = [3, 9, 27, 41, 8, 8, 50]
    for runtime in (native, torch_only):
        runtime.forward(ids, logits_wanted=4)
    assert_close(native.last_hidden_states(), torch_only.last_hidden_states())
    assert native.last_hidden_states().shape == (4, SHAPE["hidden_size"])
    features = [runtime.features for runtime in (native, torch_only)]
    assert features[0].shape == (len(ids), 3 * SHAPE["hidden_size"])
    assert_close(*features)


def test_a_token_outside_the_vocabulary_or_two_at_one_row_are_refused_and_the_cache_kept():
    native, torch_only = pair_of_runtimes(int8_model("llama", 5))
    for runtime in (native, torch_only):
        runtime.forward([1, 2, 3])
    with pytest.raises(ValueError):
        native.native([VOCAB + 3], [3], [64 + 3], torch.ones(1, 4, dtype=torch.bool), 64, 0, False)
    with pytest.raises(ValueError, match="two tokens at one cache row"):  # the threads write them at once
        native.native([4, 5], [3, 4], [64 + 3, 64 + 3], torch.ones(2, 5, dtype=torch.bool), 64, 0, False)
    assert_close(native.forward([4]), torch_only.forward([4]))


def test_what_does_not_run_natively_says_why():
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    float_model = LlamaForCausalLM(LlamaConfig(**SHAPE)).eval()
    assert "int8" in refusal(float_model, cpu)
    with_mlp_bias = quantise_weight_only(LlamaForCausalLM(LlamaConfig(**SHAPE, mlp_bias=True)).eval())
    assert "biases" in refusal(with_mlp_bias, cpu)
    bf16 = quantise_weight_only(LlamaForCausalLM(LlamaConfig(**SHAPE)).eval().to(torch.bfloat16))
    assert "float32" in refusal(bf16, cpu)
    assert refusal(int8_model("llama", 0), cpu) is None
    int4 = int8_model("llama", 0, bits=4)
    assert refusal(int4, cpu) is None
    int4.model.layers[1].self_attn.k_proj = int8_model("llama", 0).model.layers[1].self_attn.k_proj
    assert "all int8 or all int4" in refusal(int4, cpu)


def test_a_native_model_is_not_compiled_and_is_named_so(monkeypatch):
    model = int8_model("llama", 6)
    cpu = torch.device("cpu")
    monkeypatch.setenv("TANDEM_COMPILE", "1")  # the tests' default is off
    plan = plan_forward(model, cpu, ForwardSettings.for_pair(compile=True))
    assert plan.name == NATIVE_NAME
    runtime = torch_runtime_factory(model, cpu, 200, plan)(False)
    assert isinstance(runtime, StaticTorchRuntime) and runtime.native is not None and runtime.compiler is None
    # and without a compile allowed, still static and native (the eager runtime is slower)
    runtime = torch_runtime_factory(model, cpu, 200, plan_forward(model, cpu, ForwardSettings.for_pair(compile=False)))(False)
    assert isinstance(runtime, StaticTorchRuntime) and runtime.native is not None


def test_without_the_kernel_the_static_forward_runs_in_torch(monkeypatch):
    model = int8_model("llama", 7)
    monkeypatch.setattr(int8_kernel, "unavailable_reason", lambda: "no C compiler (cc) to build the int8 kernel")
    assert "no C compiler" in refusal(model, torch.device("cpu"))
    runtime = StaticTorchRuntime(model, torch.device("cpu"), 100)
    assert runtime.native is None and runtime.name != NATIVE_NAME
    assert runtime.forward([1, 2, 3]).shape == (1, VOCAB)


def test_a_partial_rotation_or_feature_layers_outside_the_model_are_refused():
    torch.manual_seed(0)
    partial = quantise_weight_only(LlamaForCausalLM(LlamaConfig(
        **SHAPE, partial_rotary_factor=0.5, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    )).eval())
    assert "rotates whole heads" in refusal(partial, torch.device("cpu"))
    with pytest.raises(ValueError, match="feature layers"):
        StaticTorchRuntime(int8_model("llama", 0), torch.device("cpu"), 100, feature_layers=(1, SHAPE["num_hidden_layers"]))


@pytest.mark.parametrize("kind, bits", [("llama", 8), ("qwen3", 8), ("llama-96-wide-heads", 8), ("llama", 4)])
def test_a_verify_gives_each_token_the_bits_its_steps_give_it(kind, bits, each_build):
    """Greedy speculation equals plain decoding only if a verified token gets the very logits
    its step would: the attention's ranges and 16-row blocks sit at fixed cache rows, and a
    short last block is padded, so the sums run in the same order either way. After a context
    that crosses a range (RANGE rows) and ends inside a block. With int4 layers too."""
    model = int8_model(kind, 12, bits)
    rng = random.Random(12)
    prompt = [rng.randrange(VOCAB) for _ in range(RANGE + 22)]
    following = [rng.randrange(VOCAB) for _ in range(9)]
    verifying, stepping = (StaticTorchRuntime(model, torch.device("cpu"), CAPACITY) for _ in range(2))
    for runtime in (verifying, stepping):
        runtime.forward(prompt, logits_wanted=1)
    verified = verifying.forward(following, logits_wanted=len(following))
    stepped = torch.cat([stepping.forward([token]) for token in following])
    assert verifying.native is not None and torch.equal(verified, stepped)


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (8, 1), (7, 1)],
                         ids=["3 heads a group (SmolLM2's)", "8 heads a group", "7 heads a group"])
def test_a_long_prompt_read_in_pieces_gives_each_token_the_bits_its_step_gives_it(heads, kv_heads, each_build):
    """A prompt is read in pieces of PROMPT_ROWS tokens, and a piece's queries are scored
    together against each block of keys (on AVX-512 three heads' queries at once, in 3s and
    then what is left of a group, with SmolLM2's heads of 64 floats): every token of a prompt
    of RANGE + 72 tokens (pieces across a range's border) must still get the very logits its
    own step gives it, and the torch forward's to float rounding."""
    torch.manual_seed(14)
    config = LlamaConfig(**{**SHAPE, "hidden_size": 8 * heads, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                                 "head_dim": 64})
    model = quantised(LlamaForCausalLM(config))
    rng = random.Random(14)
    prompt = [rng.randrange(VOCAB) for _ in range(RANGE + 72)]
    reading, torch_only = pair_of_runtimes(model)
    stepping = StaticTorchRuntime(model, torch.device("cpu"), CAPACITY)
    read = reading.forward(prompt, logits_wanted=len(prompt))
    stepped = torch.cat([stepping.forward([token]) for token in prompt])
    assert stepping.native is not None and torch.equal(read, stepped)
    assert_close(read, torch_only.forward(prompt, logits_wanted=len(prompt)))


@pytest.mark.parametrize("start", [30, RANGE - 8], ids=["below a range border", "across a range border"])
@pytest.mark.parametrize("kind", ["llama", "qwen3", "llama-96-wide-heads"])
def test_tree_nodes_and_the_steps_after_their_kept_paths_get_the_bits_steps_give_them(kind, start, each_build):
    """The same for trees, round after round: each node's logits in its tree, and the next
    tree's after `keep_path` has moved the accepted nodes down over their siblings, equal a
    chain of steps over those tokens. The weights' sum once ran in 16 lanes by cache row, so a
    key's rounding depended on where it sat, and the demo pair's greedy `staged` reply left
    plain decoding's on a near-tie. Across an attention range's border (RANGE rows): a node whose
    cache row lies past the border while its position lies before it once had its keys summed
    in the next range (ranges went by cache row, not by how many rows a token sees)."""
    model = int8_model(kind, 14)
    rng = random.Random(14)
    context = [rng.randrange(VOCAB) for _ in range(start)]
    treeing, stepping = (StaticTorchRuntime(model, torch.device("cpu"), CAPACITY) for _ in range(2))
    for runtime in (treeing, stepping):
        runtime.forward(context, logits_wanted=1)
    moved = straddled = 0
    for _ in range(8):
        tree = random_tree(rng, context[-1], 10)
        logits = forward_tree(treeing, context, tree)
        path = tree.path(len(tree) - 1)  # the last node: after its siblings in the cache
        moved += path != list(range(1, len(path) + 1))
        # the last node's row is past the border and the path's last position before it
        straddled += len(context) - 1 + path[-1] >= RANGE > len(context) - 1 + len(path)
        path_tokens = [tree.tokens[node] for node in path]
        for node, token in zip(path, path_tokens):
            assert torch.equal(logits[node], stepping.forward([token])[-1]), (node, path, len(context))
        keep_path(treeing, len(context), path)
        context = context + path_tokens
    assert moved >= 4 and treeing.native is not None
    assert straddled >= 1 if start > 100 else len(context) < RANGE


@pytest.mark.parametrize("kind", ["llama-96-wide-heads", "llama"])
def test_a_tree_node_that_sees_past_a_sibling_gets_the_bits_its_step_gives_it(kind, each_build):
    """A node whose ancestors' rows lie past a sibling's sees rows with a gap: nodes 2, 3 and 4
    below (rows p + 1, p + 2, p + 3) skip node 1's row p. The bf16 build weighs values two rows
    at a time in the order a token sees them, so node 4 pairs rows p + 1 and p + 2, which a
    chain of steps (rows p, p + 1, p + 2 for the same tokens) pairs differently by cache row
    but alike by order: the bits must still be the steps'. Heads of 96: value columns paired
    (64) and summed one by one (32); heads of 16: summed one by one only."""
    model = int8_model(kind, 15)
    rng = random.Random(15)
    context = [rng.randrange(VOCAB) for _ in range(RANGE + 22)]  # the nodes in the second range
    treeing, stepping = (StaticTorchRuntime(model, torch.device("cpu"), CAPACITY) for _ in range(2))
    for runtime in (treeing, stepping):
        runtime.forward(context, logits_wanted=1)
    tokens = [context[-1]] + [rng.randrange(VOCAB) for _ in range(4)]
    tree = TokenTree(tokens, [-1, 0, 0, 2, 3])  # node 1 a sibling of node 2; 2 -> 3 -> 4 a chain
    logits = forward_tree(treeing, context, tree)
    assert treeing.native is not None
    for node in tree.path(4):
        assert torch.equal(logits[node], stepping.forward([tokens[node]])[-1]), node


@pytest.fixture(params=ALL_VARIANTS)
def each_build(request, monkeypatch: pytest.MonkeyPatch) -> int8_kernel.Variant:
    """The kernel library as a CPU with only this variant's features builds it, loaded afresh."""
    variant = request.param
    for name, value in (("_tried", False), ("_library", None), ("_reason", None), ("_variant", None)):
        monkeypatch.setattr(int8_kernel, name, value)
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: variant.needs)
    return variant


def test_every_kernel_build_runs_the_native_forward(each_build):
    """The AVX2 builds compile the forward without AVX-512: its attention and e^x on 8 lanes;
    the portable build on one lane, in plain C; the AVX-512 BF16 build keeps a bf16 cache."""
    assert int8_kernel.variant_name() == each_build.name
    rng = random.Random(13)
    runtimes = pair_of_runtimes(int8_model("llama-96-wide-heads", 13))
    # the library says what its cache holds: bf16 (half the bytes) in a bf16 attention build
    assert int8_kernel.attention_in_bf16() == each_build.bf16_attention
    held = runtimes[0].forward_pass.cache[0][0].dtype
    assert held == (torch.bfloat16 if each_build.bf16_attention else torch.float32)
    context = [rng.randrange(VOCAB) for _ in range(40)]
    assert close(*[runtime.forward(context, logits_wanted=3) for runtime in runtimes])
    converse(rng, runtimes, context, rounds=4, same=close)


@pytest.mark.parametrize("kind", ["llama-96-wide-heads", "qwen3"])
def test_every_build_gives_the_portable_builds_logits_to_float_rounding(kind, each_build, monkeypatch):
    """The portable build (plain C, simd.h's one-lane helpers) is the reference: each build's
    logits through a prompt past a range border (RANGE rows), a verify and a step are within
    RELATIVE of its (BF16_RELATIVE for a bf16 attention build). Heads of 96 (value columns past the vectors' 64) and of 24 (no whole
    16-lane block: AVX-512 scores row by row)."""
    def logits() -> torch.Tensor:
        native, _ = pair_of_runtimes(int8_model(kind, 17))
        rng = random.Random(17)
        prompt, verify = [rng.randrange(VOCAB) for _ in range(RANGE + 12)], [rng.randrange(VOCAB) for _ in range(5)]
        return torch.cat([native.forward(prompt, logits_wanted=len(prompt)), native.forward(verify, logits_wanted=5),
                          native.forward([rng.randrange(VOCAB)])])

    built = logits()
    for name, value in (("_tried", False), ("_library", None), ("_reason", None), ("_variant", None)):
        monkeypatch.setattr(int8_kernel, name, value)
    monkeypatch.setattr(int8_kernel, "cpu_flags", lambda: frozenset())
    assert int8_kernel.variant_name() == "portable"
    assert_close(built, logits(), bf16_attention=each_build.bf16_attention)


def test_the_forwards_exponential_is_within_two_ulp_of_the_true_one(each_build):
    """Softmax and SiLU take e^x from one polynomial over simd.h's helpers (16 lanes with
    AVX-512, 8 with AVX2, whose powers of two come from exponent bits, 1 in the portable build,
    whose multiply-adds round twice): a wrong coefficient, range reduction or scaling is off by
    more than the logits' tolerance can see."""
    library = int8_kernel.loaded_library()
    x = torch.cat([torch.linspace(-103.0, 88.0, 200_003), torch.randn(10_000) * 3,
                   torch.tensor([0.0, -0.0, 88.72, -87.33, 1e-8, -1e-8])])
    out = torch.empty_like(x)
    library.tandem_exp(x.data_ptr(), x.numel(), out.data_ptr())
    true = torch.exp(x.double())
    ulp = (torch.nextafter(true.float(), torch.tensor(float("inf"))) - true.float()).double()
    normal = true > 1.2e-38  # below, float32 has fewer bits: compared absolutely
    assert ((out.double() - true).abs()[normal] <= 2.0 * ulp[normal]).all()
    assert ((out.double() - true).abs()[~normal] <= 2e-45).all()
    specials = torch.tensor([float("-inf"), float("inf"), float("nan"), -200.0, 200.0])
    out = torch.empty_like(specials)
    library.tandem_exp(specials.data_ptr(), specials.numel(), out.data_ptr())
    assert out[0] == 0 and out[1] == float("inf") and out[2].isnan() and out[3] == 0 and out[4] == float("inf")


@pytest.mark.parametrize("kind", ["llama", "qwen3", "llama-96-wide-heads"])
def test_independent_sequences_in_one_forward_get_the_bits_each_gets_alone(kind, each_build):
    """Many replies share each weight pass (the distillation writer): a prompt, its first
    token and the steps of other sequences in one forward, each token attending over its own
    sequence's rows only. Every token's logits and features equal those of a runtime that
    holds its sequence alone, to the bit, across a range border (RANGE rows) too."""
    model = int8_model(kind, 15)
    rng = random.Random(15)
    region, layers = RANGE + 72, (0, 2)
    batched = NativeForward(StaticCacheForward(model, 4 * region, torch.device("cpu"), layers))
    alone = [StaticTorchRuntime(model, torch.device("cpu"), region, feature_layers=layers) for _ in range(4)]
    sequences: list[list[int]] = [[] for _ in range(4)]
    # (sequence, new tokens) per forward: prompts beside steps, one sequence left out a round
    rounds = [[(0, 5), (1, RANGE + 3)], [(0, 1), (1, 1), (2, 37)], [(1, 1), (2, 1), (3, RANGE - 2)], [(0, 1), (2, 1), (3, 1)],
              [(0, 1), (1, 1), (2, 1), (3, 1)], [(3, 1), (1, 1)]]
    for forward in rounds:
        ids, positions, rows, first, seen, owners = [], [], [], [], [], []
        for sequence, count in forward:
            for _ in range(count):
                position = len(sequences[sequence])
                token = rng.randrange(VOCAB)
                sequences[sequence].append(token)
                ids.append(token), positions.append(position), rows.append(sequence * region + position)
                first.append(sequence * region), seen.append(position + 1), owners.append(sequence)
        logits, features = batched.spans(ids, positions, rows, first, seen, wanted_from=0)
        at = 0
        for sequence, count in forward:
            runtime = alone[sequence]
            expected = runtime.forward(sequences[sequence][len(runtime):], logits_wanted=count)
            assert torch.equal(logits[at : at + count], expected), (sequence, count)
            assert torch.equal(features[at : at + count], runtime.features[len(runtime) - count : len(runtime)])
            at += count
    assert all(runtime.native is not None for runtime in alone) and max(map(len, sequences)) > RANGE


def test_a_token_outside_its_own_span_is_refused():
    model = int8_model("llama", 16)
    forward = StaticCacheForward(model, 100, torch.device("cpu"))
    batched = NativeForward(forward)
    rows = forward.cache_rows  # 100, or rounded up to whole blocks of keys (key_blocks.py)
    with pytest.raises(ValueError):  # its row past its span
        batched.spans([1], [3], [4], [0], [4], wanted_from=0)
    with pytest.raises(ValueError):  # a span past the cache
        batched.spans([1], [3], [rows - 1], [rows - 4], [5], wanted_from=0)
    logits, features = batched.spans([1, 2], [0, 0], [0, 50], [0, 50], [1, 1], wanted_from=1)
    assert logits.shape == (1, VOCAB) and features is None

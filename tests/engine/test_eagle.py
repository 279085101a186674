"""EAGLE-3 heads on tiny random models built in the test: greedy chains and trees equal `ar`
token for token, sampled output follows the target's distribution, a head in the public
layout loads and drafts on both runtimes, and a head made for another target (or a damaged
one) is refused with the reason before anything runs."""
from __future__ import annotations

import copy
import json
import random
from collections import Counter

import pytest
import torch

from engine.chat_prompt import Message
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.drafters.model_drafter import ModelDrafter
from engine.drafters.tree_drafter import TreeDrafter, TreeShape
from engine.errors import ModelLoadError
from engine.events import Finished, Provenance
from engine.models import LoadedModel
from engine.runtime.eagle3 import Eagle3Runtime
from engine.runtime import eagle3, eagle3_native, int8_kernel
from engine.runtime.int8_weights import quantise_rows
from engine.runtime.eagle3_head import Eagle3Config, Eagle3Head, check_fits_target, load_head, save_head
from engine.runtime.torch_eager import TorchRuntime
from engine.sampling import Sampler
from engine.session import LoadedPair, load_pair
from engine.tree_shape import FixedTreeShape
from tests.engine.test_sampling_pipeline import PROMPT, SAMPLES, chi_square, critical_value, exact_two_token_distribution
from tests.engine.tiny_models import TEMPLATE, WORDS, run_round, tiny_gguf, tiny_llama

LAYERS = 4
LAYER_IDS = (0, 2, 3)


def tiny_target(seed: int = 3, vocab_size: int = 64):
    return tiny_llama(seed=seed, vocab_size=vocab_size, layers=LAYERS)


def tiny_head(
    seed: int, vocab_size: int = 64, draft_vocab: int = 40, target_hidden: int = 32, layer_ids: tuple[int, ...] = LAYER_IDS,
    head_dim: int = 8,
) -> Eagle3Head:
    torch.manual_seed(seed)
    config = Eagle3Config(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
        target_hidden_size=target_hidden, vocab_size=vocab_size, draft_vocab_size=draft_vocab, layer_ids=layer_ids,
    )
    head = Eagle3Head(config)
    kept = sorted(random.Random(seed).sample(range(vocab_size), draft_vocab))
    with torch.no_grad():
        head.d2t.copy_(torch.tensor(kept) - torch.arange(draft_vocab))
        head.t2d.zero_()
        head.t2d[kept] = True
        head.lm_head.weight.mul_(20.0)  # confident drafts: a random head is then often confidently wrong
    return head.eval()


def eagle_pair(make_word_tokenizer, head_seed: int) -> LoadedPair:
    tokenizer = make_word_tokenizer(WORDS, chat_template=TEMPLATE, eos_token="<pad>")
    target = LoadedModel(tiny_target(), tokenizer, torch.device("cpu"), torch.float32, "fp32", "tiny", context_length=160)
    pair = LoadedPair(PairConfig("tiny", ModelSpec("tiny"), eagle="tiny-head"), target, None, tiny_head(head_seed))
    pair.stop_token_ids = frozenset()
    return pair


def reply(pair: LoadedPair, method: str, prompt: str, **settings) -> Finished:
    events = list(pair.generate([Message("user", prompt)], DecodeSettings(method=method, max_new_tokens=40, **settings)))
    return events[-1]


@pytest.mark.parametrize("head_seed", range(3))
def test_greedy_eagle_chain_and_tree_equal_ar(make_word_tokenizer, head_seed):
    pair = eagle_pair(make_word_tokenizer, head_seed)
    assert {"eagle", "eagle-tree"} <= set(pair.methods)
    prompt = " ".join(random.Random(head_seed).choices(WORDS[:40], k=8))
    expected = reply(pair, "ar", prompt).token_ids
    for method, shapes in (("eagle", ["auto"]), ("eagle-tree", ["auto", "6x3", "16x5"])):
        for shape in shapes:
            for k in (1, 3, 5):
                finished = reply(pair, method, prompt, draft_tokens=k, tree_shape=shape)
                assert finished.token_ids == expected, (method, shape, k)
                assert finished.stats.draft_tokens_proposed > 0  # the head really drafted
    # The caches end as a plain target step would leave them: every slot the head keeps as
    # context was computed from the target's own features.
    head = pair.eagle_runner
    assert head.reusable_slots() <= len(pair.target_runner) + 1


def reference_head_logits(
    head: Eagle3Head, model, ids: list[int], embeddings: torch.Tensor | None = None, every: bool = False,
) -> torch.Tensor:
    """The head's logits after `ids` (after each of them, with `every`), computed from scratch:
    one fresh target forward for the features, then the head causally over every slot, each
    reading the feature before it."""
    with torch.inference_mode():
        states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        features = torch.cat([states[layer][0] for layer in LAYER_IDS], dim=-1)  # (n, F)
        hidden = torch.zeros(len(ids), head.config.hidden_size)
        hidden[1:] = head.fuse(features[:-1])
        embeddings = model.get_input_embeddings().weight if embeddings is None else embeddings
        query, key, value = head.attention_inputs(embeddings[torch.tensor(ids)][None], hidden[None], torch.arange(len(ids))[None])
        attended = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, enable_gqa=True)
        logits = head.draft_logits(head.finish(attended, hidden[None])[0])
        return logits if every else logits[-1]


def rounds_then_head_logits(
    runner: Eagle3Runtime, target: TorchRuntime, vocab: int, seed: int, prompt: tuple[int, ...] = (1, 5, 9, 2, 7),
) -> tuple[list[int], torch.Tensor]:
    """25 rounds of trees, accepted paths, plain rounds and recomputed slots after `prompt`;
    then the context and the head's logits after it."""
    drafter = TreeDrafter(runner, vocab, FixedTreeShape(TreeShape(budget=8, depth=3, branching=3, beam=2)))
    sampler = Sampler(temperature=1.0, generator=torch.Generator().manual_seed(seed))
    context = list(prompt)
    accepted = Counter()
    for _ in range(25):
        outcome = run_round(target, drafter, context, sampler)
        accepted[outcome.accepted] += 1
        context += outcome.tokens
    assert len(accepted) >= 2, accepted  # rounds that kept different path lengths
    return context, runner.logits_for(context)[0]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("static_shapes", [False, True], ids=["cpu-shapes", "gpu-shapes"])
def test_the_heads_cache_after_many_rounds_equals_a_fresh_recompute(seed, static_shapes, monkeypatch):
    """Afterwards the head's view of the context is exactly what a fresh pass over it gives
    (float32 throughout); also where attention reads the whole cache, as on a GPU (a small
    growth step makes the cache, and so that shape, grow during the rounds)."""
    monkeypatch.setattr(eagle3, "GROWTH", 16)
    vocab = 12  # small, so that a random head's trees are often partly right
    model = tiny_target(seed=seed, vocab_size=vocab)
    head = tiny_head(seed + 10, vocab_size=vocab, draft_vocab=10)
    target = TorchRuntime(model, torch.device("cpu"), feature_layers=LAYER_IDS)
    runner = Eagle3Runtime(head, target, model.get_input_embeddings().weight, dtype=torch.float32, quantise=False)
    runner._layer.static_shapes = static_shapes
    context, logits = rounds_then_head_logits(runner, target, vocab, seed)
    expected = torch.full((vocab,), float("-inf"))
    expected[head.target_ids] = reference_head_logits(head, model, context)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def int8_rounded(head: Eagle3Head) -> Eagle3Head:
    """A copy of `head` whose matrices are their int8 roundings (what the native head multiplies)."""
    rounded = copy.deepcopy(head)
    layer = rounded.midlayer
    matrices = [rounded.fc, rounded.lm_head, layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
    with torch.no_grad():
        for matrix in matrices:
            weight, scale = quantise_rows(matrix.weight)
            matrix.weight.copy_(weight.float() * scale[:, None])
    return rounded


@pytest.mark.skipif(int8_kernel.unavailable_reason() is not None, reason="the int8 kernel cannot be built here")
@pytest.mark.parametrize("seed, head_dim", [(0, 8), (1, 16), (3, 16)])
def test_the_native_heads_cache_after_many_rounds_matches_a_fresh_torch_recompute(seed, head_dim, monkeypatch):
    """The head in C (int8 weights) after the same rounds: its logits are the torch head's over
    the same int8-rounded weights, up to the activations' int8 rounding and float32 sums in
    another order (and bf16 attention on that build). A wrong cache slot, rotation, norm or mask is off by whole units. Small
    growth steps and prompt pieces make the cache grow (and the C view follow it) and the
    prompt arrive in many calls; a prompt of 22 tokens more than attention's range spans two;
    heads of 16 take the vector attention path, heads of 8 the plain one."""
    monkeypatch.setattr(eagle3_native, "GROWTH", 16)
    monkeypatch.setattr(eagle3_native, "PIECE_ROWS", 8)
    vocab = 12
    model = tiny_target(seed=seed, vocab_size=vocab)
    head = tiny_head(seed + 10, vocab_size=vocab, draft_vocab=10, head_dim=head_dim)
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if "norm" in name:
                parameter.normal_(1.0, 0.3)  # random norms: a swapped or forgotten one would show
    target = TorchRuntime(model, torch.device("cpu"), feature_layers=LAYER_IDS)
    runner = Eagle3Runtime(head, target, model.get_input_embeddings().weight, native=True)
    assert runner.name == "EAGLE-3 (native int8)"
    prompt = tuple(random.Random(seed).choices(range(vocab), k=int8_kernel.attention_range_rows() + 22))
    context, logits = rounds_then_head_logits(runner, target, vocab, seed, prompt)
    weight, scale = quantise_rows(model.get_input_embeddings().weight)
    reference, embeddings = int8_rounded(head), weight.float() * scale[:, None]
    expected = reference_head_logits(reference, model, context, embeddings=embeddings)
    drafted = logits[head.target_ids]
    # bf16 attention (the AVX-512 BF16 build) rounds its inputs to 8 significant bits
    relative = 1e-2 if int8_kernel.attention_in_bf16() else 2e-3
    assert (drafted - expected).abs().max() <= relative * expected.abs().max(), (drafted - expected).abs().max()
    assert int(drafted.argmax()) == int(expected.argmax())
    assert torch.isinf(logits[~head.t2d]).all()  # tokens outside the draft vocabulary are never drafted
    # The context read anew in pieces, every position's logits: each piece's own mask and rows.
    runner.crop(0)
    read = len(runner.target) - 1
    every = runner.forward(context[:read], logits_wanted=read - 3)[:, head.target_ids]
    expected = reference_head_logits(reference, model, context[:read], embeddings=embeddings, every=True)[3:]
    assert (every - expected).abs().max() <= relative * expected.abs().max(), (every - expected).abs().max()


def test_a_head_the_native_path_cannot_run_is_refused_with_the_reason_or_runs_in_torch():
    model = tiny_target()
    target = TorchRuntime(model, torch.device("cpu"), feature_layers=LAYER_IDS)
    embeddings = model.get_input_embeddings().weight
    odd = tiny_head(4, head_dim=7)
    with pytest.raises(ValueError, match="head_dim 7"):
        Eagle3Runtime(odd, target, embeddings, native=True)
    assert Eagle3Runtime(odd, target, embeddings).name.startswith("EAGLE-3 (")  # the automatic choice: torch
    assert "native" not in Eagle3Runtime(odd, target, embeddings).name
    with pytest.raises(ValueError, match="not 32 wide"):
        Eagle3Runtime(tiny_head(4), target, embeddings[:, :16], native=True)


# --- sampling exactness -------------------------------------------------------------------


def first_two_tokens(make_drafter, seed: int) -> tuple[Counter, dict]:
    vocab = 8
    target_model = tiny_llama(seed=1, vocab_size=vocab, layers=LAYERS)
    head = tiny_head(seed=2, vocab_size=vocab, draft_vocab=6)
    with torch.no_grad():
        head.lm_head.weight.div_(10.0)  # softer drafts: every token gets proposed sometimes
    sampler = Sampler(temperature=1.3, top_k=6, top_p=0.9, generator=torch.Generator().manual_seed(seed))
    target = TorchRuntime(target_model, torch.device("cpu"), feature_layers=LAYER_IDS)
    runner = Eagle3Runtime(head, target, target_model.get_input_embeddings().weight, dtype=torch.float32)
    drafter = make_drafter(runner, vocab)
    counts: Counter = Counter()
    drafted = 0
    for _ in range(SAMPLES):
        context = list(PROMPT)
        while len(context) < len(PROMPT) + 2:
            outcome = run_round(target, drafter, context, sampler)
            drafted += outcome.proposed
            context += outcome.tokens
        counts[tuple(context[len(PROMPT) : len(PROMPT) + 2])] += 1
    assert drafted > SAMPLES / 2  # the second token came through the head's drafts
    return counts, exact_two_token_distribution(target_model, sampler)


@pytest.mark.parametrize("make_drafter", [
    lambda runner, vocab: ModelDrafter(runner, vocab, 2),
    lambda runner, vocab: TreeDrafter(runner, vocab, FixedTreeShape(TreeShape(budget=6, depth=2, branching=3, beam=2))),
], ids=["chain", "tree"])
def test_sampled_eagle_decoding_follows_the_target_distribution(make_drafter):
    counts, expected = first_two_tokens(make_drafter, seed=7)
    statistic, df = chi_square(counts, expected, SAMPLES)
    assert statistic <= critical_value(df), f"chi-square {statistic:.1f} on {df} df"


# --- the public layout, and refusals -----------------------------------------------------


def saved_head(folder, head: Eagle3Head):
    save_head(head, folder, dtype=torch.float32)
    return folder


def test_a_head_in_the_public_layout_round_trips(tmp_path):
    head = tiny_head(5)
    folder = saved_head(tmp_path / "head", head)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == 40 and config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(LAYER_IDS)
    from safetensors.torch import load_file

    names = set(load_file(str(folder / "model.safetensors")))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= names
    loaded = load_head(folder)
    for name, value in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)


def test_a_pair_with_a_head_folder_drafts_on_torch_and_on_llamacpp(tmp_path):
    target_model = tiny_target()
    gguf = tiny_gguf(target_model, tmp_path / "target")
    head_folder = saved_head(tmp_path / "head", tiny_head(1))
    runtimes = ["torch"] + (["llama.cpp"] if _has_llama_cpp() else [])
    for runtime in runtimes:
        source = str(gguf) if runtime == "llama.cpp" else str(tmp_path / "target")
        pair = load_pair(PairConfig("tiny", ModelSpec(source, precision="fp32"), runtime=runtime, eagle=str(head_folder)))
        try:
            pair.stop_token_ids = frozenset()
            expected = reply(pair, "ar", "ab cd ef")
            for method in ("eagle", "eagle-tree"):
                finished = reply(pair, method, "ab cd ef")
                assert finished.token_ids == expected.token_ids, (runtime, method)
                assert finished.stats.draft_tokens_proposed > 0
        finally:
            pair.close()


def _has_llama_cpp() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


@pytest.mark.parametrize("mismatch, message", [
    (dict(target_hidden=48), "features 48 wide"),
    (dict(vocab_size=80, draft_vocab=40), "vocabulary has 80 tokens"),
])
def test_a_head_for_another_target_is_refused(mismatch, message):
    head = tiny_head(0, **mismatch)
    with pytest.raises(ModelLoadError, match=message):
        check_fits_target(head, 32, 64, LAYERS)


def test_a_head_reading_layers_the_target_lacks_is_refused():
    with pytest.raises(ModelLoadError, match=r"reads target layers \[0, 2, 3\], and the target has 3"):
        check_fits_target(tiny_head(0), 32, 64, 3)


def test_damaged_heads_are_refused_with_the_reason(tmp_path):
    folder = saved_head(tmp_path / "head", tiny_head(0))
    weights = folder / "model.safetensors"
    intact = weights.read_bytes()
    weights.write_bytes(intact[: len(intact) // 2])
    with pytest.raises(ModelLoadError, match="weights .* cannot be read"):
        load_head(folder)
    weights.write_bytes(intact)
    (folder / "config.json").write_text("{ not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_head(folder)
    head = tiny_head(0)
    with torch.no_grad():
        head.d2t[3] = 1000  # maps a draft id past the target's vocabulary
    with pytest.raises(ModelLoadError, match="d2t is corrupt"):
        load_head(saved_head(tmp_path / "bad-map", head))
    with pytest.raises(ModelLoadError, match="EAGLE-3 head not found"):
        from engine.models import load_eagle_head

        load_eagle_head(str(tmp_path / "nowhere"), None)

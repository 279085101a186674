"""`tandem export-gguf --draft-for TARGET`: a draft that llama.cpp's speculative decoding pairs
with its target. Judged by llama.cpp's own rules on both files as llama.cpp loads them, and,
where $LLAMA_SERVER names llama.cpp's server, by decoding the demo pair with drafts accepted."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader, GGUFWriter
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from engine.cli import main
from engine.config import DEMO_DRAFT_FOLDER, DecodeSettings
from engine.demo_model import demo_gguf_path
from engine.runtime.reduced_vocabulary import ReducedVocabulary
from engine.tools import llama_server
from engine.tools.export_gguf import DRAFT_PRECISION, export_gguf
from engine.tools.gguf_draft_for_target import DraftPairingError
from engine.runtime.llamacpp_pairing import speculation_refusals

from .test_gguf_export import (  # noqa: F401 (llama_cpp is a fixture)
    EMBEDDING_ROWS, PROMPT_IDS, TOLERANCE, LlamaCppRunner, bpe_tokenizer, llama_cpp, save_tiny_llama,
)

# The ids a tiny reduced draft keeps, in its own order (model id i is KEPT_IDS[i]); the prompt
# also holds ids it dropped (3, 4, 6, 10, 12), which it must read through its shared row.
KEPT_IDS = (2, 0, 1, 5, 7, 9, 11, 13, 14, 16, 20, 30)


def save_reduced_draft(folder: Path) -> Path:
    """A tied draft of KEPT_IDS + one shared row, on the tiny tokenizer's 64-id vocabulary."""
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=len(KEPT_IDS) + 1, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        initializer_range=0.15,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    bpe_tokenizer().save_pretrained(folder)
    ReducedVocabulary(KEPT_IDS, EMBEDDING_ROWS).save(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    folder = save_tiny_llama(tmp_path_factory.mktemp("target"), tied=False, seed=1)
    return export_gguf(folder, folder / "target.gguf", "f32")


@pytest.fixture(scope="module")
def reduced_draft(tmp_path_factory) -> Path:
    return save_reduced_draft(tmp_path_factory.mktemp("draft"))


def test_llama_cpp_accepts_a_reduced_draft_written_for_its_target(llama_cpp, tiny_target, reduced_draft, tmp_path):
    plain = export_gguf(reduced_draft, tmp_path / "plain.gguf", "f32")  # in the draft's own ids
    assert speculation_refusals(tiny_target, plain) == ["token 5 is 'Ċ' in the draft, 'c' in the target"]
    paired = export_gguf(reduced_draft, tmp_path / "paired.gguf", "f32", draft_for=tiny_target)
    assert speculation_refusals(tiny_target, paired) == []


def test_the_paired_draft_keeps_its_logits_and_never_proposes_a_dropped_token(llama_cpp, tiny_target, reduced_draft, tmp_path):
    paired = export_gguf(reduced_draft, tmp_path / "paired.gguf", "f32", draft_for=tiny_target)
    runner = LlamaCppRunner(llama_cpp, paired)
    try:
        actual = runner.decode(PROMPT_IDS, start=0)  # (T, 64): fed in the target's ids
    finally:
        runner.close()
    vocabulary = ReducedVocabulary.load(reduced_draft)
    model = LlamaForCausalLM.from_pretrained(reduced_draft, dtype=torch.float32).eval()
    with torch.no_grad():  # as Tandem runs it: dropped ids read as the shared row
        expected = model(torch.tensor([vocabulary.to_model_ids(PROMPT_IDS)])).logits[0, :, : len(KEPT_IDS)].numpy()
    kept, dropped = np.array(KEPT_IDS), np.setdiff1d(np.arange(EMBEDDING_ROWS), KEPT_IDS)
    scale = np.abs(expected).max()
    assert np.abs(actual[:, kept] - expected).max() / scale < TOLERANCE["f32"]
    # A dropped token's logit is the mean of the kept tokens' logits: always below the best.
    assert np.abs(actual[:, dropped] - expected.mean(axis=1, keepdims=True)).max() / scale < TOLERANCE["f32"]
    assert (actual[:, kept].max(axis=1) > actual[:, dropped].max(axis=1)).all()


def test_the_paired_draft_carries_the_targets_tokenizer_as_stored(tiny_target, reduced_draft, tmp_path):
    paired = export_gguf(reduced_draft, tmp_path / "paired.gguf", "f16", draft_for=tiny_target)
    target_fields = GGUFReader(tiny_target).fields
    draft_fields = GGUFReader(paired).fields
    tokenizer_keys = {key for key in target_fields if key.startswith("tokenizer.")}
    assert tokenizer_keys == {key for key in draft_fields if key.startswith("tokenizer.")}
    for key in tokenizer_keys:
        assert draft_fields[key].contents() == target_fields[key].contents(), key
    assert draft_fields["llama.vocab_size"].contents() == EMBEDDING_ROWS
    tensors = {tensor.name: tuple(tensor.shape) for tensor in GGUFReader(paired).tensors}
    assert tensors["token_embd.weight"] == tensors["output.weight"] == (64, EMBEDDING_ROWS)  # (hidden, vocab)


def test_a_draft_with_another_tokenizer_is_refused(reduced_draft, tmp_path):
    other_target = tmp_path / "other.gguf"
    writer = GGUFWriter(other_target, arch="llama")
    tokens = [f"t{index}" for index in range(EMBEDDING_ROWS)]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(DraftPairingError, match="token 0 is '<|endoftext|>' in the draft and 't0' in the target"):
        export_gguf(reduced_draft, tmp_path / "paired.gguf", draft_for=other_target)
    assert not (tmp_path / "paired.gguf").exists()


def test_the_command_writes_for_the_target_the_draft_was_distilled_from(llama_cpp, tiny_target, reduced_draft, tmp_path, capsys):
    (reduced_draft / "distill-report.json").write_text(json.dumps({"target": str(tiny_target)}), encoding="utf-8")
    try:
        out = tmp_path / "draft.gguf"
        assert main(["export-gguf", str(reduced_draft), "--out", str(out), "--draft-for"]) == 0
    finally:
        (reduced_draft / "distill-report.json").unlink()
    printed = capsys.readouterr().out
    assert "llama.cpp accepts it" in printed and f"-md {out}" in printed
    assert speculation_refusals(tiny_target, out) == []


def test_the_command_asks_for_a_target_it_cannot_find(reduced_draft, capsys):
    assert main(["export-gguf", str(reduced_draft), "--draft-for"]) == 2
    assert "--draft-for TARGET.gguf" in capsys.readouterr().err
    assert main(["export-gguf", str(reduced_draft), "--draft-for", str(reduced_draft)]) == 2
    assert "not a GGUF file" in capsys.readouterr().err


# The demo pair


@pytest.fixture(scope="module")
def demo_draft_for_llama_cpp(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "draft.gguf"
    return export_gguf(DEMO_DRAFT_FOLDER, out, DRAFT_PRECISION, draft_for=demo_gguf_path())


def test_llama_cpp_accepts_the_demo_draft_for_the_demo_target(llama_cpp, demo_draft_for_llama_cpp):
    shipped = DEMO_DRAFT_FOLDER / f"model.{DRAFT_PRECISION}.gguf"  # Tandem's own, in the draft's 8,193 ids
    assert speculation_refusals(demo_gguf_path(), shipped) == [
        "8193 tokens in the draft, 49152 in the target (at most 128 apart)"
    ]
    assert speculation_refusals(demo_gguf_path(), demo_draft_for_llama_cpp) == []


PROMPTS = ["What is the capital of France?", "Write a short poem about the sea.", "Explain what a CPU does."]


@pytest.mark.skipif(not os.environ.get(llama_server.ENVIRONMENT_VARIABLE), reason="$LLAMA_SERVER names no llama-server")
def test_llama_server_decodes_the_demo_pair_with_the_drafts_accepted(demo_draft_for_llama_cpp):
    binary = llama_server.find_binary()
    target = demo_gguf_path()
    settings = DecodeSettings(draft_tokens=4)  # greedy
    tokenizer = AutoTokenizer.from_pretrained(DEMO_DRAFT_FOLDER)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        for text in PROMPTS
    ]
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]

    def replies(method: str, draft: Path | None) -> list[llama_server.ServerReply]:
        server = llama_server.LlamaServer(binary, llama_server.server_arguments(method, target, draft, 1024, 2, settings))
        try:
            return [server.complete(method, ids, 48, settings) for ids in prompt_ids]
        finally:
            server.close()

    plain = replies(llama_server.PLAIN, None)
    speculative = replies(llama_server.DRAFT, demo_draft_for_llama_cpp)
    assert [reply.token_ids for reply in speculative] == [reply.token_ids for reply in plain]
    drafted = sum(reply.stats.draft_tokens_proposed for reply in speculative)
    accepted = sum(reply.stats.draft_tokens_accepted for reply in speculative)
    # The demo draft agrees with the target on 0.2-0.45 of these replies' tokens, so at depth 4 about
    # one drafted token in eight is kept; one that proposed wrong tokens would keep next to none.
    assert drafted > 0 and accepted > drafted / 20, (drafted, accepted)

    # Tandem's own export, in the draft's own ids: llama-server logs "the target and draft vocabs
    # are not compatible" and decodes without drafting.
    refused = replies(llama_server.DRAFT, DEMO_DRAFT_FOLDER / f"model.{DRAFT_PRECISION}.gguf")
    assert sum(reply.stats.draft_tokens_proposed for reply in refused) == 0

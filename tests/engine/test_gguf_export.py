"""GGUF export: llama.cpp runs the exported file with transformers' logits, at every position
and in every precision; the file carries the vocabulary; bad folders fail clearly and leave no file."""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, TokenType
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from engine.runtime import llamacpp_library
from engine.tools import export_gguf as gguf_export
from engine.cli import main
from engine.config import DEMO_DRAFT_FOLDER
from engine.tools.distill.data import GenerationSettings
from engine.tools.distill.pipeline import Distillation, RunSettings
from engine.tools.distill.train import TrainSettings
from engine.errors import ModelLoadError
from engine.runtime.cpu import repacking_crashes
from engine.tools.export_gguf import DRAFT_PRECISION, export_gguf
from engine.tools.gguf_vocab import UnsupportedTokenizerError, read_vocabulary

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LETTERS = ["a", "b", "c", "d", "e", "Ġ", "Ċ"]
MERGES = [("a", "b"), ("ab", "c"), ("Ġ", "a"), ("d", "e")]
USER_TOKEN = "<tool>"  # an added token that is not special
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
EMBEDDING_ROWS = 64  # more rows than tokens: the exporter must name the padding rows
# Positions 0-11, decoded in two calls so the second reads the KV cache the first wrote.
PROMPT_IDS = [1, 3, 5, 10, 11, 4, 6, 12, 7, 9, 13, 2]
FIRST_CALL = 7

# Largest |llama.cpp - transformers| over all logits, relative to the largest |logit|.
TOLERANCE = {"f32": 1e-4, "f16": 5e-3, "bf16": 3e-2, "q8_0": 6e-2}


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with a dozen tokens, three special ones and one plain added one."""
    vocabulary = {token: index for index, token in enumerate(SPECIAL + LETTERS)}
    for left, right in MERGES:
        vocabulary[left + right] = len(vocabulary)
    backend = Tokenizer(models.BPE(vocabulary, list(MERGES)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
        unk_token="<|endoftext|>", pad_token="<|im_end|>",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.add_tokens([USER_TOKEN])
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def save_tiny_llama(folder: Path, tied: bool, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=EMBEDDING_ROWS, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=tied,
        # Large weights make attention far from uniform, so a wrong rotary layout shows in the logits.
        initializer_range=0.15,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    bpe_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def tiny_folder(request, tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tied=request.param)


def transformers_logits(folder: Path) -> np.ndarray:
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([PROMPT_IDS])).logits[0].numpy()  # (T, vocab)


class LlamaCppRunner:
    """The exported file in llama.cpp through its C API, with logits for every token fed."""

    def __init__(self, llama_cpp, path: Path):
        self.api = llama_cpp
        model_params = llama_cpp.llama_model_default_params()
        # As Tandem's own runtime loads it: on a CPU with AMX, llama.cpp's repacked buffers
        # crash its first decode (engine/runtime/cpu.py, repacking_crashes).
        model_params.use_extra_bufts = not repacking_crashes()
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), model_params)
        assert self.model, f"llama.cpp could not load {path}"
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = 64
        params.n_threads = params.n_threads_batch = 1
        # An f32 cache and no flash attention (whose CPU kernel rounds through f16): either
        # alone costs more than the f32 tolerance.
        params.type_k = params.type_v = llama_cpp.GGML_TYPE_F32
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.context = llama_cpp.llama_init_from_model(self.model, params)
        assert self.context
        self.vocab_size = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.batch = llama_cpp.llama_batch_init(64, 0, 1)

    def decode(self, token_ids: list[int], start: int) -> np.ndarray:
        batch = self.batch
        batch.n_tokens = len(token_ids)
        for index, token_id in enumerate(token_ids):
            batch.token[index] = token_id
            batch.pos[index] = start + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = 0
            batch.logits[index] = 1
        assert self.api.llama_decode(self.context, batch) == 0
        return np.stack([
            np.ctypeslib.as_array(self.api.llama_get_logits_ith(self.context, index), shape=(self.vocab_size,)).copy()
            for index in range(len(token_ids))
        ])  # (T, vocab)

    def close(self) -> None:
        self.api.llama_batch_free(self.batch)
        self.api.llama_free(self.context)
        self.api.llama_model_free(self.model)


@pytest.fixture(scope="module")
def llama_cpp():
    module = pytest.importorskip("llama_cpp")

    @module.llama_log_callback
    def quiet(level, text, user_data):
        pass  # llama.cpp prints hundreds of lines per model loaded

    module.llama_log_set(quiet, ctypes.c_void_p(0))
    yield module
    from llama_cpp._logger import llama_log_callback  # llama-cpp-python's own, installed on import

    # Back to the callback that was there: Tandem's, once its runtime has loaded the library
    # (tests of the runtime read llama.cpp's log through it), else llama-cpp-python's own
    module.llama_log_set(llamacpp_library._log_callback or llama_log_callback, ctypes.c_void_p(0))


def llama_cpp_logits(llama_cpp, path: Path) -> np.ndarray:
    runner = LlamaCppRunner(llama_cpp, path)
    try:
        return np.concatenate([
            runner.decode(PROMPT_IDS[:FIRST_CALL], start=0),
            runner.decode(PROMPT_IDS[FIRST_CALL:], start=FIRST_CALL),
        ])
    finally:
        runner.close()


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16", "q8_0"])
def test_llama_cpp_runs_the_export_with_transformers_logits(llama_cpp, tiny_folder, tmp_path, precision):
    path = export_gguf(tiny_folder, tmp_path / "model.gguf", precision)
    expected = transformers_logits(tiny_folder)
    actual = llama_cpp_logits(llama_cpp, path)
    assert actual.shape == expected.shape
    scale = np.abs(expected).max()
    per_position = np.abs(actual - expected).max(axis=1) / scale
    assert per_position.max() < TOLERANCE[precision], f"relative error by position: {per_position.round(5)}"


def test_without_the_rotary_reordering_llama_cpp_disagrees(llama_cpp, tiny_folder, tmp_path, monkeypatch):
    """The logits test can fail: the same export without the Q/K reordering is far off."""
    monkeypatch.setattr(gguf_export, "interleave_rotary_halves", lambda projection, heads: projection)
    path = export_gguf(tiny_folder, tmp_path / "model.gguf", "f32")
    expected = transformers_logits(tiny_folder)
    error = np.abs(llama_cpp_logits(llama_cpp, path) - expected).max() / np.abs(expected).max()
    assert error > max(TOLERANCE.values())


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16", "q8_0"])
def test_the_file_holds_llama_metadata_and_typed_tensors(tiny_folder, tmp_path, precision):
    path = export_gguf(tiny_folder, tmp_path / "model.gguf", precision)
    reader = GGUFReader(path)
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "llama"
    assert fields["llama.block_count"] == 2
    assert fields["llama.embedding_length"] == 64
    assert fields["llama.feed_forward_length"] == 128
    assert fields["llama.attention.head_count"] == 4
    assert fields["llama.attention.head_count_kv"] == 2
    assert fields["llama.rope.freq_base"] == pytest.approx(500.0)
    assert fields["llama.rope.dimension_count"] == 16
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    assert fields["llama.context_length"] == 256
    assert fields["llama.vocab_size"] == EMBEDDING_ROWS

    tensors = {tensor.name: tensor.tensor_type for tensor in reader.tensors}
    tied = LlamaConfig.from_pretrained(tiny_folder).tie_word_embeddings
    assert ("output.weight" in tensors) is not tied
    assert {"token_embd.weight", "output_norm.weight", "blk.1.attn_q.weight", "blk.1.ffn_down.weight"} <= set(tensors)
    matrix_type = {
        "f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
        "bf16": GGMLQuantizationType.BF16, "q8_0": GGMLQuantizationType.Q8_0,
    }[precision]
    assert tensors["blk.0.attn_k.weight"] == matrix_type
    assert tensors["token_embd.weight"] == matrix_type
    assert tensors["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32
    assert tensors["output_norm.weight"] == GGMLQuantizationType.F32


def test_the_file_carries_the_vocabulary(tiny_folder, tmp_path):
    reader = GGUFReader(export_gguf(tiny_folder, tmp_path / "model.gguf", "f16"))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    tokenizer = bpe_tokenizer()
    tokens, token_types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert len(tokens) == len(token_types) == EMBEDDING_ROWS
    for token, token_id in tokenizer.get_vocab().items():
        assert tokens[token_id] == token
    assert tokens[len(tokenizer)] == f"[PAD{len(tokenizer)}]"
    assert token_types[SPECIAL.index("<|im_end|>")] == TokenType.CONTROL
    assert token_types[tokenizer.convert_tokens_to_ids(USER_TOKEN)] == TokenType.USER_DEFINED
    assert token_types[tokenizer.convert_tokens_to_ids("ab")] == TokenType.NORMAL
    assert fields["tokenizer.ggml.merges"] == [f"{left} {right}" for left, right in MERGES]
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "default"
    assert fields["tokenizer.ggml.bos_token_id"] == 1
    assert fields["tokenizer.ggml.eos_token_id"] == 2
    assert fields["tokenizer.ggml.padding_token_id"] == 2
    assert fields["tokenizer.ggml.unknown_token_id"] == 0
    assert fields["tokenizer.ggml.add_bos_token"] is False
    assert fields["tokenizer.chat_template"] == TEMPLATE


def test_smollm_tokenizers_get_llama_cpps_smollm_pre_tokenizer():
    assert read_vocabulary(DEMO_DRAFT_FOLDER, 49152).pre == "smollm"


def test_the_shipped_demo_draft_gguf_runs_like_its_safetensors(llama_cpp):
    shipped = DEMO_DRAFT_FOLDER / f"model.{DRAFT_PRECISION}.gguf"
    assert shipped.name in (DEMO_DRAFT_FOLDER / "SHA256SUMS").read_text(encoding="utf-8")
    expected = transformers_logits(DEMO_DRAFT_FOLDER)
    actual = llama_cpp_logits(llama_cpp, shipped)
    assert np.abs(actual - expected).max() / np.abs(expected).max() < TOLERANCE[DRAFT_PRECISION]


def test_a_distillation_writes_the_drafts_gguf_beside_it(tmp_path):
    target = save_tiny_llama(tmp_path / "target", tied=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": text}) for text in ["abc", "de ab", "cab", "ed"] * 10), encoding="utf-8")
    settings = RunSettings(
        target=str(target), size="tiny", tokens=200, heldout_tokens=32, prompts=str(prompts),
        generation=GenerationSettings(max_new_tokens=8, stored_top_k=8), training=TrainSettings(epochs=1),
    )
    draft = tmp_path / "draft"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads spin-wait on each tiny matmul of a busy 2-core machine
    try:
        assert Distillation.start(draft, settings, device="cpu").run().status == "finished"
    finally:
        torch.set_num_threads(threads)
    assert GGUFReader(draft / f"model.{DRAFT_PRECISION}.gguf").fields["general.architecture"].contents() == "llama"


def test_the_command_writes_beside_the_weights_and_reports_the_size(tmp_path, capsys):
    folder = save_tiny_llama(tmp_path / "model", tied=True)
    assert main(["export-gguf", str(folder), "--precision", "bf16"]) == 0
    written = folder / "model.bf16.gguf"
    assert written.is_file()
    assert str(written) in capsys.readouterr().out


# Errors


def assert_fails_naming(folder: Path, error_type=ModelLoadError) -> None:
    with pytest.raises(error_type) as raised:
        export_gguf(folder, folder.parent / "out.gguf")
    assert str(folder) in str(raised.value)
    assert not list(folder.parent.glob("*.gguf")) and not list(folder.parent.glob(".*partial"))


def test_a_folder_without_config_fails_clearly(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_fails_naming(tmp_path / "empty")


def test_a_missing_folder_fails_clearly(tmp_path):
    assert_fails_naming(tmp_path / "nowhere")


def test_a_model_of_another_architecture_fails_clearly(tmp_path):
    folder = save_tiny_llama(tmp_path / "model", tied=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    assert_fails_naming(folder)


def test_a_folder_without_weights_fails_clearly(tmp_path):
    folder = save_tiny_llama(tmp_path / "model", tied=True)
    (folder / "model.safetensors").unlink()
    assert_fails_naming(folder)


def test_unreadable_weights_fail_clearly(tmp_path):
    folder = save_tiny_llama(tmp_path / "model", tied=True)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    assert_fails_naming(folder)


def test_a_word_level_tokenizer_fails_clearly(tmp_path, make_word_tokenizer):
    folder = save_tiny_llama(tmp_path / "model", tied=True)
    make_word_tokenizer(["w1", "w2"]).save_pretrained(folder)
    assert_fails_naming(folder, UnsupportedTokenizerError)


def test_an_export_that_fails_midway_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch):
    folder = save_tiny_llama(tmp_path / "model", tied=True)
    out = folder / "model.f16.gguf"
    out.write_bytes(b"the previous export")

    def killed(self, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_export.GGUFWriter, "write_tensors_to_file", killed)
    with pytest.raises(KeyboardInterrupt):
        export_gguf(folder)
    assert out.read_bytes() == b"the previous export"
    assert not list(folder.glob(".*partial"))


def test_the_command_reports_errors_without_a_traceback(tmp_path, capsys):
    assert main(["export-gguf", str(tmp_path / "nowhere")]) == 2
    assert "not found" in capsys.readouterr().err

"""A llama.cpp context over a GGUF model, as the llama.cpp runtime drives it: a token tree
in one `llama_decode`, kept paths, rolled-back chains. Plain numpy and llama-cpp-python,
no torch, so that it can also run in a worker process that never loads torch
(`llamacpp_process`, for llama.cpp on a GPU next to CUDA torch).

A token tree runs in ONE `llama_decode`: every root-to-leaf path is a llama.cpp sequence,
and each tree token carries the ids of every sequence that passes through it. The
committed context is sequence 0. The KV cache is unified, so a token shared by several
sequences is stored once. Keeping the accepted path makes its sequence's tokens part of
sequence 0 and removes every other sequence, which frees the rejected branches' cells; a
chain rolls back with one `seq_rm`.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError, OutOfMemoryError
from .cpu import ThreadBudget, chosen_threads, physical_cores, repacking_crashes
from .llamacpp_library import failure_reason, forget_log, layer_input_functions, library
from .llamacpp_library import version as llamacpp_version

COMMITTED = 0  # the sequence that holds the committed context
# Sequences a context can hold at once: the committed one plus one per tree leaf. Trees
# are at most 128 drafted nodes (config.DecodeSettings), so at most 128 leaves.
SEQUENCES = 130
BATCH_TOKENS = 512  # tokens per llama_decode call; a longer prompt is fed in pieces
Q8_0_BLOCK = 32  # values per Q8_0 block: a Q8_0 KV cache needs heads a whole number of blocks wide


@dataclass
class GgufFacts:
    """What the rest of the engine needs to know about a GGUF model llama.cpp has loaded,
    here (`LlamaCppWeights`) or in a worker process (`llamacpp_process.WorkerWeights`). Both
    kinds open contexts (`open_context`) with the methods `LlamaCppContext` has, and close."""

    path: Path
    vocab_size: int
    context_length: int
    eos_token_ids: frozenset[int]
    supports_trees: bool
    gpu_layers: int
    file_type: str  # e.g. "Q4_1", as llama.cpp describes the weights
    hidden_size: int = 0
    layer_count: int = 0


@dataclass
class LlamaCppWeights(GgufFacts):
    """A GGUF model loaded in this process: the weights every context over it shares."""

    handle: ctypes.c_void_p | None = None

    def open_context(
        self, context_length: int, threads: int | None = None, hidden_states: bool = False, feature_layers: tuple[int, ...] = (),
    ) -> LlamaCppContext:
        return LlamaCppContext(self, context_length, threads, hidden_states, feature_layers)

    def close(self) -> None:
        if self.handle:
            library().llama_model_free(self.handle)
            self.handle = None


def load_weights(path: Path, use_gpu: bool) -> LlamaCppWeights:
    """Load `path` with llama.cpp; every failure is a `ModelLoadError` naming the file."""
    llama_cpp = library()
    if not path.is_file():
        raise ModelLoadError(f"Model file not found: {path}")
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = -1 if use_gpu and llama_cpp.llama_supports_gpu_offload() else 0
    if repacking_crashes() and params.n_gpu_layers == 0:  # offloaded, the CPU keeps no matmul weight
        params.use_extra_bufts = False
    forget_log()
    handle = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not handle:
        reason = failure_reason(
            f"its format or architecture may be one this llama.cpp ({llamacpp_version()}) does not read; "
            "update llama-cpp-python, or choose the PyTorch runtime"
        )
        raise ModelLoadError(f"Could not load the GGUF file {path} with llama.cpp: {reason}.")
    description = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(handle, description, len(description))
    vocab = llama_cpp.llama_model_get_vocab(handle)
    stop_ids = {llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)}
    return LlamaCppWeights(
        handle=handle,
        path=path,
        vocab_size=llama_cpp.llama_vocab_n_tokens(vocab),
        context_length=llama_cpp.llama_model_n_ctx_train(handle),
        eos_token_ids=frozenset(token for token in stop_ids if token >= 0),
        # A sliding window drops old positions by itself; a kept path would not survive it.
        supports_trees=llama_cpp.llama_model_n_swa(handle) == 0,
        gpu_layers=params.n_gpu_layers,
        file_type=description.value.decode(errors="replace").rsplit(" ", 1)[-1],
        hidden_size=llama_cpp.llama_model_n_embd(handle),
        layer_count=llama_cpp.llama_model_n_layer(handle),
    )


@dataclass(frozen=True)
class Attention:
    """How a llama.cpp context computes attention: the kernel, and the type its KV cache
    stores keys and values in (None: llama.cpp's default, F16)."""

    kernel: int  # a LLAMA_FLASH_ATTN_TYPE_*
    cache_type: int | None = None  # a GGML_TYPE_*


def verifying_attention(weights: LlamaCppWeights) -> Attention:
    """The attention of a context that verifies drafts over `weights`: on the CPU, flash
    attention over an 8-bit (Q8_0) KV cache, so that a token verified in a batch gets, bit
    for bit, the logits plain decoding's single-token step gives it; on a GPU, llama.cpp's
    own choice.

    Why: greedy speculation must write plain decoding's reply, and a 135M model meets
    near-ties (a top-2 logit gap under 1) every few dozen tokens. llama.cpp's CPU kernels
    round differently by the number of tokens in a decode:
    - the plain kernel from the first token (0.3-0.9 apart at Q8_0): greedy `chain` replies
      to the held-out prompts equalled `ar`'s in 1 of 10;
    - flash attention over an F16 or F32 cache once the context passes 256 cells, where a
      single token's attention is split across threads and merged (0.8 apart);
    - flash attention over a Q8_0 cache takes neither path (llama.cpp splits and tiles only
      F16/F32 caches): bit-equal in every run measured (340 tokens on two threads), and `chain`
      equalled `ar` in 10 of 10.
    What it costs (docs/BENCHMARKS.md, "Greedy speculation on llama.cpp against plain
    decoding"; 2-core EPYC, busy): at chat lengths (~300 tokens) a step and `chain`'s 5-token
    verify cost what the plain kernel's do (45 against 51 ms, 182 against 171), and `ar`
    wrote as many tokens a second; after 1,500 tokens flash attention's per-cell loop makes a
    step 1.4x and a 5-token verify 1.7x dearer, so long conversations decode slower. The
    Q8_0 cache rounds keys and values for `ar` as for every method (llama.cpp's usual
    near-lossless setting) and holds them in about half the memory (peak 881 -> 786 MB).
    """
    llama_cpp = library()
    if weights.gpu_layers:
        return Attention(llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)
    head_size = llama_cpp.llama_model_n_embd(weights.handle) // llama_cpp.llama_model_n_head(weights.handle)
    if head_size % Q8_0_BLOCK:  # llama.cpp cannot make such a cache: F16, bit-equal to 256 cells
        return Attention(llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED)
    return Attention(llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama_cpp.GGML_TYPE_Q8_0)


@dataclass
class DecodeOutputs:
    """What one run of new tokens gives back, float32: the wanted rows' logits (and their
    final-norm hidden states where the context was opened with them), and every new token's
    layer features where it records them."""

    logits: np.ndarray  # (logits_wanted, V)
    hidden: np.ndarray | None  # (logits_wanted, H)
    features: np.ndarray | None  # (T, H * len(feature_layers))


#: how a run gets the arrays it fills: numpy's own, or a worker's shared buffer
Allocate = Callable[[tuple[int, ...]], np.ndarray]


def _numpy_arrays(shape: tuple[int, ...]) -> np.ndarray:
    return np.empty(shape, dtype=np.float32)


class LlamaCppContext:
    """One llama.cpp context (a KV cache of `context_length` tokens) over loaded weights.

    It keeps its own slots (the tokens it holds, each with its position and a sequence that
    holds its whole path); the runtime above it checks the calls, so this trusts them."""

    def __init__(
        self, weights: LlamaCppWeights, context_length: int, threads: int | None = None, hidden_states: bool = False,
        feature_layers: tuple[int, ...] = (),
    ):
        self._llama = library()
        self.weights = weights
        self.vocab_size = weights.vocab_size
        params = self._llama.llama_context_default_params()
        params.n_ctx = context_length
        # llama.cpp clamps a batch to the context and then refuses its own output buffer.
        self._batch_tokens = min(BATCH_TOKENS, context_length)
        params.n_batch = params.n_ubatch = self._batch_tokens
        params.n_seq_max = SEQUENCES
        # llama.cpp reserves an output row per sequence at least, and asserts that fits.
        params.n_outputs_max = max(self._batch_tokens, SEQUENCES)
        params.kv_unified = True  # tree tokens are shared by several sequences
        params.n_threads = params.n_threads_batch = threads or physical_cores()
        # Threads follow the free cores unless the caller or TANDEM_THREADS fixed them.
        self._thread_budget = None if threads or chosen_threads() else ThreadBudget(physical_cores())
        self.threads = params.n_threads  # the threads the next decode runs on
        params.no_perf = True
        attention = verifying_attention(weights)
        params.flash_attn_type = attention.kernel
        if attention.cache_type is not None:
            params.type_k = params.type_v = attention.cache_type
        # With embeddings on and no pooling, each decode also returns every output token's
        # final-norm hidden state beside its logits (what learned verifier heads read).
        params.embeddings = hidden_states
        params.pooling_type = 0  # LLAMA_POOLING_TYPE_NONE
        self.hidden_width = self._llama.llama_model_n_embd(weights.handle) if hidden_states else 0
        forget_log()
        self._context = self._llama.llama_init_from_model(weights.handle, params)
        if not self._context:
            reason = failure_reason("the machine is probably out of memory: close other programs, or choose a smaller model")
            raise OutOfMemoryError(f"llama.cpp could not make a context of {context_length} tokens for {weights.path}: {reason}.")
        self._memory = self._llama.llama_get_memory(self._context)
        self.feature_layers = tuple(feature_layers)
        self._layer_inputs = self._extract_layer_inputs(self.feature_layers)
        self._batch = self._llama.llama_batch_init(self._batch_tokens, 0, SEQUENCES)
        self._slot_positions: list[int] = []  # slot -> its position
        self._slot_sequence: list[int] = []  # slot -> a sequence that holds its whole path
        self._sequence_tip: dict[int, int] = {}  # sequence -> its deepest slot
        self._free_sequences = list(range(SEQUENCES - 1, COMMITTED, -1))

    def close(self) -> None:
        if self._context:
            self._llama.llama_batch_free(self._batch)
            self._llama.llama_free(self._context)
            self._context = None

    def __del__(self):
        self.close()

    def run(
        self, new_ids: list[int], parents: list[int], positions: list[int], logits_wanted: int,
        allocate: Allocate = _numpy_arrays,
    ) -> DecodeOutputs:
        """Append `new_ids`, token i following slot `parents[i]` (a held slot or an earlier new
        token) at `positions[i]`, and return the outputs in arrays from `allocate`."""
        sequences = self._assign_sequences(parents, positions)
        logits = allocate((logits_wanted, self.vocab_size))
        hidden = allocate((logits_wanted, self.hidden_width)) if self.hidden_width else None
        width = self._llama.llama_model_n_embd(self.weights.handle)
        features = allocate((len(new_ids), width * len(self.feature_layers))) if self.feature_layers else None
        first_wanted = len(new_ids) - logits_wanted
        filled = 0
        for begin in range(0, len(new_ids), self._batch_tokens):
            end = min(begin + self._batch_tokens, len(new_ids))
            outputs = self._fill_batch(new_ids, positions, sequences, begin, end, first_wanted)
            self._follow_thread_budget()
            status = self._llama.llama_decode(self._context, self._batch)
            if status != 0:
                raise self._decode_error(status)
            if features is not None:
                # One block of n_embd floats per batch token, in the batch's order.
                for column, layer in enumerate(self.feature_layers):
                    rows = np.ctypeslib.as_array(self._layer_inputs(self._context, layer), shape=(end - begin, width))
                    features[begin:end, column * width:(column + 1) * width] = rows
            # By batch row: with embeddings on, llama.cpp outputs every token, not only the
            # ones asked for. Rows are copied: llama.cpp reuses its buffers.
            for row in range(end - begin - outputs, end - begin):
                row_logits = self._llama.llama_get_logits_ith(self._context, row)
                logits[filled] = np.ctypeslib.as_array(row_logits, shape=(self.vocab_size,))
                if hidden is not None:
                    row_hidden = self._llama.llama_get_embeddings_ith(self._context, row)
                    hidden[filled] = np.ctypeslib.as_array(row_hidden, shape=(self.hidden_width,))
                filled += 1
        return DecodeOutputs(logits, hidden, features)

    def keep(self, prefix: int, extra_slots: list[int]) -> None:
        """Keep slots [0, prefix) and then `extra_slots`, a path continuing the prefix."""
        llama, memory = self._llama, self._memory
        end = prefix + len(extra_slots)
        path_sequence = self._slot_sequence[extra_slots[-1]] if extra_slots else COMMITTED
        if path_sequence == COMMITTED:
            llama.llama_memory_seq_rm(memory, COMMITTED, end, -1)
        else:
            llama.llama_memory_seq_rm(memory, COMMITTED, prefix, -1)
            llama.llama_memory_seq_cp(memory, path_sequence, COMMITTED, prefix, end)
        for sequence in list(self._sequence_tip):
            if sequence != COMMITTED:
                llama.llama_memory_seq_rm(memory, sequence, -1, -1)  # frees cells no sequence holds
        self._reset_sequences(end)

    def clear(self) -> None:
        """Drop every held token."""
        self._llama.llama_memory_clear(self._memory, True)
        self._reset_sequences(0)

    def _follow_thread_budget(self) -> None:
        if self._thread_budget is None:
            return
        threads = self._thread_budget.threads()
        if threads != self.threads:
            self._llama.llama_set_n_threads(self._context, threads, threads)
            self.threads = threads

    def _extract_layer_inputs(self, layers: tuple[int, ...]):
        """Turn on llama.cpp's extraction of these layers' inputs; the getter, or None."""
        if not layers:
            return None
        functions = layer_input_functions()
        if functions is None:
            raise ModelLoadError(
                "This build of llama.cpp cannot hand out layer features, which an EAGLE-3 head needs; "
                "run the pair on the torch runtime."
            )
        setter, getter = functions
        for layer in layers:
            setter(self._context, layer, True)
        return getter

    # Sequences

    def _assign_sequences(self, parents: list[int], positions: list[int]) -> list[list[int]]:
        """For each new token, the sequences it belongs to, its own path's first (llama.cpp
        masks a token's attention by its first sequence). A token that continues its
        parent's sequence joins it; a branch gets a fresh sequence that every ancestor joins:
        new ones through the batch, cached ones by `seq_cp`."""
        start = len(self._slot_positions)
        sequences: list[list[int]] = []
        own: list[int] = []
        for index, parent in enumerate(parents):
            slot = start + index
            parent_sequence = COMMITTED if parent < 0 else (own[parent - start] if parent >= start else self._slot_sequence[parent])
            if parent < 0 or self._sequence_tip.get(parent_sequence) == parent:
                sequence = parent_sequence
            else:
                sequence = self._fresh_sequence()
                ancestor = parent
                while ancestor >= start:
                    sequences[ancestor - start].append(sequence)
                    ancestor = parents[ancestor - start]
                if ancestor >= 0:
                    position = self._slot_positions[ancestor]
                    self._llama.llama_memory_seq_cp(self._memory, self._slot_sequence[ancestor], sequence, -1, position + 1)
            self._sequence_tip[sequence] = slot
            own.append(sequence)
            sequences.append([sequence])
        self._slot_sequence.extend(own)
        self._slot_positions.extend(positions)
        return sequences

    def _fresh_sequence(self) -> int:
        if not self._free_sequences:
            raise ValueError(f"a token tree with more than {SEQUENCES - 1} leaves does not fit one llama.cpp context")
        sequence = self._free_sequences.pop()
        self._llama.llama_memory_seq_rm(self._memory, sequence, -1, -1)
        return sequence

    def _reset_sequences(self, length: int) -> None:
        self._slot_positions = list(range(length))
        self._slot_sequence = [COMMITTED] * length
        self._sequence_tip = {COMMITTED: length - 1} if length else {}
        self._free_sequences = list(range(SEQUENCES - 1, COMMITTED, -1))

    # The batch

    def _fill_batch(self, ids, positions, sequences, begin: int, end: int, first_wanted: int) -> int:
        batch = self._batch
        outputs = 0
        for row, index in enumerate(range(begin, end)):
            batch.token[row] = ids[index]
            batch.pos[row] = positions[index]
            token_sequences = sequences[index]
            batch.n_seq_id[row] = len(token_sequences)
            seq_ids = batch.seq_id[row]
            for column, sequence in enumerate(token_sequences):
                seq_ids[column] = sequence
            wanted = index >= first_wanted
            batch.logits[row] = wanted
            outputs += wanted
        batch.n_tokens = end - begin
        return outputs

    def _decode_error(self, status: int) -> Exception:
        self.clear()
        if status == 1:
            return OutOfMemoryError(
                f"llama.cpp found no room in its KV cache for {self.weights.path.name}: start a new chat, or choose a smaller model."
            )
        return ModelLoadError(f"llama.cpp failed to run {self.weights.path.name} (llama_decode returned {status}); start a new chat and try again.")

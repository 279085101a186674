"""Torch models from Hugging Face folders: loading weights at a precision, converting a GGUF
file into such a folder, and opening the torch runtime a loaded model's forward plan names
(forward_plan.py decides which).

Only the runtimes (and the offline tools that train models) touch transformers' model
classes; the rest of the engine sees a `LoadedModel` and the runtimes it opens.
"""
from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, PreTrainedModel

from ..errors import ModelLoadError, OutOfMemoryError
from .base import ModelRuntime
from .forward_plan import ForwardPlan
from .int8_weights import quantise_weight_only
from .model_reading import READ_ERRORS, without_progress_bars
from .torch_eager import TorchRuntime
from .torch_static import StaticTorchRuntime

FLOAT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# bitsandbytes casts every int8 matmul input to fp16 (and logs a warning on each call when it
# is not fp16 already), so int8 models keep their other layers in fp16 too.
INT8_COMPANION_DTYPE = torch.float16
# Room past the context for the last round's tree (its budget is at most 64 tokens).
STATIC_CACHE_SPARE_ROWS = 128


def load_torch_weights(folder: Path, device: torch.device, precision: str) -> PreTrainedModel:
    """The model in `folder` at `precision` on `device`; every failure is a clear error."""
    try:
        return _weights_in_memory(folder, device, precision)
    except torch.cuda.OutOfMemoryError as error:
        raise OutOfMemoryError(
            "The GPU ran out of memory while loading the model. "
            "Try 8-bit (int8) precision or a smaller model."
        ) from error
    except MemoryError as error:
        raise OutOfMemoryError(
            "The machine ran out of memory while loading the model. "
            "Try 8-bit (int8) precision or a smaller model."
        ) from error




def _weights_in_memory(folder: Path, device: torch.device, precision: str) -> PreTrainedModel:
    """The model at `precision`; out-of-memory errors are left to `load_torch_weights`, since
    quantising can run out too (each layer's float and int8 copies live at once)."""
    try:
        with without_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(
                folder, device_map={"": str(device)}, **_precision_options(precision)
            )
    except READ_ERRORS as error:
        raise ModelLoadError(f"Could not load the model in {folder}: {error}") from error
    model.eval()
    if precision in ("int8-wo", "int4-wo"):
        quantise_weight_only(model, bits=4 if precision == "int4-wo" else 8)
        if device.type == "cpu":
            # The CPU's int8 matmuls take float32 in and give float32 out (int8_weights.py),
            # and bf16 attention would round a k-token verify differently from a one-token
            # step, which those integer matmuls avoid; the rest of the model is small.
            model.float()
    return model


def _precision_options(precision: str) -> dict[str, Any]:
    if precision == "int8":
        # bitsandbytes 0.50 runs int8 matmuls on the CPU as well as on CUDA (checked here with the demo model).
        return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True), "dtype": INT8_COMPANION_DTYPE}
    if precision in ("int8-wo", "int4-wo"):
        return {"dtype": torch.bfloat16}  # quantised after loading (`quantise_weight_only`)
    return {"dtype": FLOAT_DTYPES[precision]}


def convert_gguf(gguf: Path, destination: Path) -> None:
    """Dequantise `gguf` into a safetensors Hugging Face folder at `destination`."""
    with without_progress_bars(), _gguf_metadata_read_once():
        try:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        except READ_ERRORS as error:
            raise ModelLoadError(f"Could not read the GGUF file {gguf}: {error}") from error
        # transformers refuses to save a GGUF-loaded model ("not serializable") because of these
        # markers; the weights themselves are plain dequantised tensors and save fine.
        model.hf_quantizer = None
        del model.config.quantization_config
        model.save_pretrained(destination)
        tokenizer.save_pretrained(destination)


@contextlib.contextmanager
def _gguf_metadata_read_once():
    """Within one conversion, gguf-py's reader of a file and its tensor-name maps are built once,
    and the reader slices a plain array over the file's mapping.

    transformers opens the file three times (config, weights, tokenizer), and each opening
    parses every metadata field, the 49,152-token vocabulary included, element by element;
    it also builds the tensor-name map of the architecture once per module of the model (397
    times for the demo target). On the 2-core development CPU that was ~15 of the demo
    conversion's ~20 s; dequantising the weights took 2. transformers imports both names from
    `gguf` at each call, so caching wrappers in their place there are what it uses.
    The one reading left parsed the demo's fields in 2.4 s, most of it np.memmap's Python-level
    slicing (~5M calls, two per vocabulary string); over a plain ndarray view of the same
    mapping it takes 1.0 s, with the same fields and tensors."""
    import gguf
    import gguf.gguf_reader as reader_module

    original_reader, original_map, original_numpy = gguf.GGUFReader, gguf.get_tensor_name_map, reader_module.np
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path, mode: str = "r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = original_reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = shared_reader, functools.lru_cache(maxsize=None)(original_map)
    reader_module.np = _NumpyWithPlainMaps("numpy")
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, reader_module.np = original_reader, original_map, original_numpy


class _NumpyWithPlainMaps(types.ModuleType):
    """numpy, as gguf-py's reader sees it during a conversion: its memmap is a plain ndarray
    view of the mapping (which keeps the mapping open)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(numpy, name)

    @staticmethod
    def memmap(*args: Any, **kwargs: Any) -> numpy.ndarray:
        return numpy.memmap(*args, **kwargs).view(numpy.ndarray)


def torch_runtime_factory(
    model: PreTrainedModel, device: torch.device, context_length: int, plan: ForwardPlan
) -> Callable[[bool, tuple[int, ...]], ModelRuntime]:
    """(hidden_states, feature_layers) -> a fresh runtime over `model`, the one `plan` names:
    the static one for its native, graph-captured or compiled forwards, else the eager one."""

    def open_runtime(hidden_states: bool, feature_layers: tuple[int, ...] = ()) -> ModelRuntime:
        if plan.static_cache:
            return StaticTorchRuntime(
                model, device, context_length + STATIC_CACHE_SPARE_ROWS, hidden_states=hidden_states, feature_layers=feature_layers,
                plan=plan,
            )
        return TorchRuntime(model, device, hidden_states=hidden_states, feature_layers=feature_layers)

    return open_runtime

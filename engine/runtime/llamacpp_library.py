"""llama-cpp-python's low-level API as Tandem uses it: the import, a version check, the
library's log kept off the terminal, and re-quantising a GGUF file.

llama.cpp's log lines ("init: embeddings required but some input tokens were not marked as
outputs -> overriding", "llama_model_load: error loading model: …") are written for its own
developers, and a warning from one call is still in the log when an unrelated call fails.
So they go to the Python logger `tandem.llama_cpp` at DEBUG level (`logging.basicConfig(
level=logging.DEBUG)` shows them) and never into an error message: errors are Tandem's own
sentences, which a cause the log names (`failure_reason`) may sharpen.

Only this module and `llamacpp.py` import `llama_cpp`. The library compiles from source on
most machines, so its absence is an ordinary situation: `available()` says whether it is
there, and anything that needs it raises a `ModelLoadError` that says how to install it.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ..errors import ModelLoadError
from ..paths import cache_dir

TESTED_VERSION = "0.3.36"
# What the runtime calls; a build that lacks any of them cannot run trees or roll back.
NEEDED_SYMBOLS = (
    "llama_backend_init", "llama_model_load_from_file", "llama_model_free", "llama_init_from_model",
    "llama_free", "llama_get_memory", "llama_memory_seq_rm", "llama_memory_seq_cp", "llama_memory_clear",
    "llama_batch_init", "llama_batch_free", "llama_decode", "llama_get_logits", "llama_model_get_vocab",
    "llama_vocab_n_tokens", "llama_model_n_ctx_train", "llama_model_quantize", "llama_log_set", "llama_set_n_threads",
)
NEEDED_CONTEXT_FIELDS = ("n_seq_max", "kv_unified", "n_threads", "n_threads_batch", "embeddings", "flash_attn_type")
INSTALL_HINT = f"pip install llama-cpp-python=={TESTED_VERSION} (it compiles, about 5 minutes)"

# llama.cpp's file types for `llama_model_quantize`, by Tandem's precision names.
QUANTISED_FILE_TYPES = {"int8": (7, "Q8_0"), "int8-wo": (7, "Q8_0"), "int4-wo": (14, "Q4_K_S"), "fp16": (1, "F16"), "bf16": (32, "BF16"),
                        "fp32": (0, "F32")}

_KEPT_LOG_LEVELS = (3, 4)  # ggml's WARN and ERROR, the ones `failure_reason` reads
_recent_log: deque[str] = deque(maxlen=40)
_log_lock = threading.Lock()
_log_callback = None  # kept referenced: llama.cpp calls it for as long as the process lives
debug_log = logging.getLogger("tandem.llama_cpp")
# Causes llama.cpp names in its log that a user can act on, as Tandem says them.
_KNOWN_CAUSES = (
    (re.compile(r"unknown model architecture: '([^']+)'"),
     lambda match: f"this llama.cpp ({version()}) does not know the model architecture '{match[1]}': "
                   "update llama-cpp-python, or choose the PyTorch runtime"),
    (re.compile(r"failed to allocate|unable to allocate|out of memory", re.IGNORECASE),
     lambda match: "the machine ran out of memory: close other programs, or choose a smaller model"),
)
_backend_ready = False


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def version() -> str:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def library():
    """The `llama_cpp` module, checked for what Tandem needs, with its log captured."""
    global _backend_ready
    if not available():
        raise ModelLoadError(f"The llama.cpp runtime needs llama-cpp-python: {INSTALL_HINT}.")
    import llama_cpp

    missing = [name for name in NEEDED_SYMBOLS if not hasattr(llama_cpp, name)]
    fields = {name for name, _ in llama_cpp.llama_context_params._fields_}
    missing += [f"llama_context_params.{name}" for name in NEEDED_CONTEXT_FIELDS if name not in fields]
    if missing:
        raise ModelLoadError(
            f"llama-cpp-python {version()} lacks {', '.join(missing)}, which Tandem's llama.cpp runtime "
            f"needs (tested with {TESTED_VERSION}): {INSTALL_HINT}."
        )
    if not _backend_ready:
        _capture_log(llama_cpp)
        llama_cpp.llama_backend_init()
        _backend_ready = True
    return llama_cpp


# llama.cpp's own EAGLE-3 support makes a context extract the residual stream entering any
# layer, for every token of a batch, in the same pass (`llama_set_embeddings_layer_inp` and
# its getter, src/llama-ext.h). This is the fast way to read a target's features: no graph
# callback per tensor, no extra pass. The two functions are exported with C++ linkage, so they
# are found by their mangled names (Itanium on Linux and macOS, MSVC on Windows); a build
# without them simply offers no EAGLE-3 drafting on llama.cpp.
_LAYER_INPUT_SYMBOLS = {
    "set": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb", "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z"),
    "get": ("_Z30llama_get_embeddings_layer_inpP13llama_contextj", "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"),
}


def layer_input_functions():
    """(set, get): turn on a layer's input extraction for a context, and read it as a float
    pointer (n_embd floats per batch token); None where this build lacks them."""
    shared = library().llama_cpp._lib
    found = {}
    for role, names in _LAYER_INPUT_SYMBOLS.items():
        for name in names:
            try:
                found[role] = getattr(shared, name)
                break
            except AttributeError:
                continue
        else:
            return None
    setter, getter = found["set"], found["get"]
    setter.argtypes, setter.restype = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None
    getter.argtypes, getter.restype = [ctypes.c_void_p, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float)
    return setter, getter


def forget_log() -> None:
    """Start a fresh record of warnings and errors, before a call whose failure may be read."""
    with _log_lock:
        _recent_log.clear()


def failure_reason(fallback: str) -> str:
    """Why the last llama.cpp call failed, in Tandem's words: a cause its log names (since
    `forget_log`) that a user can act on, else `fallback`. Never llama.cpp's own lines."""
    with _log_lock:
        lines = list(_recent_log)
        _recent_log.clear()
    for line in reversed(lines):
        for pattern, sentence in _KNOWN_CAUSES:
            match = pattern.search(line)
            if match:
                return sentence(match)
    return fallback


def _capture_log(llama_cpp) -> None:
    """Send llama.cpp's log to the debug logger instead of the pages of loading details it
    prints to the terminal by default, and keep its warnings and errors for `failure_reason`."""
    global _log_callback

    @llama_cpp.llama_log_callback
    def keep(level, text, user_data):
        if level not in _KEPT_LOG_LEVELS and not debug_log.isEnabledFor(logging.DEBUG):
            return
        line = text.decode("utf-8", errors="replace")
        debug_log.debug("%s", line.rstrip("\n"))
        if level in _KEPT_LOG_LEVELS:
            with _log_lock:
                _recent_log.append(line)

    _log_callback = keep
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def quantised_copy(gguf: Path, precision: str, announce: Callable[[str], None] | None = None) -> Path:
    """`gguf` re-quantised to `precision` (int8 = Q8_0, int4-wo = Q4_K_S, fp16, bf16, fp32), made once into the
    cache folder (seconds for a small model) and reused after that. `announce` hears that a
    conversion starts, only when one does: a cached copy needs no message."""
    llama_cpp = library()
    file_type, type_name = QUANTISED_FILE_TYPES[precision]
    stat = gguf.stat()
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{version()}"
    destination = cache_dir() / "models" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.{type_name}.gguf"
    if destination.is_file():
        return destination
    if announce is not None:
        announce(f"Converting {gguf.name} to {type_name} (first use only)…")
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{destination.name}.partial-", dir=destination.parent)
    os.close(handle)
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = file_type
        params.allow_requantize = True
        params.nthread = os.cpu_count() or 1
        forget_log()
        failed = llama_cpp.llama_model_quantize(str(gguf).encode(), partial.encode(), ctypes.byref(params))
        if failed:
            reason = failure_reason("llama.cpp could not read it; check that the file is whole, or choose the PyTorch runtime")
            raise ModelLoadError(f"Could not convert {gguf} to {type_name}: {reason}.")
        os.replace(partial, destination)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return destination

"""What reading a model's files can raise, and transformers' progress bars kept quiet while
it reads. Light to import: the llama.cpp path reads GGUF tokenizers with these and never
loads transformers' model classes (engine/runtime/torch_load.py, ~85 MB once imported).
"""
from __future__ import annotations

import contextlib
import importlib
import struct
from collections.abc import Iterator

from safetensors import SafetensorError
from transformers.utils import logging as transformers_logging

# What transformers, gguf and safetensors raise for files they cannot read.
READ_ERRORS = (OSError, ValueError, KeyError, struct.error, SafetensorError, ImportError)


# Transformers' GGUF reader draws its own tqdm bar ("Converting and de-quantizing GGUF
# tensors"), which its progress-bar switch does not reach.
GGUF_READER_MODULE = "transformers.modeling_gguf_pytorch_utils"


def _without_bar(iterable, *args, **kwargs):
    """What the GGUF reader iterates instead of its tqdm bar: the tensors themselves. Not a
    tqdm with disable=True: tqdm's constructor starts its monitor thread before it reads
    `disable`, and that thread outlived the load (the soak counted it as leaked)."""
    return iterable


@contextlib.contextmanager
def without_progress_bars() -> Iterator[None]:
    """Transformers' own tqdm bars ("Loading weights", "Writing model shards", the GGUF
    reader's) off while a model loads: the chat and the app say what they are doing in their
    own words, and a bar drawn into the terminal chat's screen breaks it. On again after, for
    scripts that use transformers themselves."""
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        gguf_reader = importlib.import_module(GGUF_READER_MODULE)
    except ImportError:  # a transformers that reads GGUF files elsewhere, or not at all
        gguf_reader = None
    gguf_bar = getattr(gguf_reader, "tqdm", None)
    if gguf_bar is not None:
        gguf_reader.tqdm = _without_bar
    try:
        yield
    finally:
        if gguf_bar is not None:
            gguf_reader.tqdm = gguf_bar
        if was_enabled:
            transformers_logging.enable_progress_bar()

"""llama-cpp-python's own plain generation (`Llama.create_chat_completion`) of a GGUF file:
what `tandem bench` sets beside Tandem's methods as `llamacpp-ar`. No torch here, so that a
llama.cpp worker process (`llamacpp_worker`) can run it where llama.cpp must not share the
app's process; `peers.LlamaCppGeneration` runs it here or there.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import ConfigError
from .cpu import repacking_crashes


class PlainGeneration:
    """One `Llama` over `gguf`; `sampling` holds create_chat_completion's sampling arguments."""

    def __init__(
        self, gguf: str, context_length: int, threads: int, gpu_layers: int, sampling: dict, seed: int,
        runtime_attention: bool = False,
    ):
        """`runtime_attention`: the attention Tandem's llama.cpp runtime verifies with
        (llamacpp_context.verifying_attention: flash attention, over a Q8_0 cache on the CPU),
        else llama-cpp-python's defaults (plain attention, an F16 cache)."""
        try:
            from llama_cpp import GGML_TYPE_Q8_0, Llama
        except ImportError as error:
            raise ConfigError(
                "llamacpp-ar needs llama-cpp-python: pip install llama-cpp-python (it compiles, ~5 minutes)"
            ) from error
        self.sampling = dict(sampling)
        with _plain_buffers_where_repacking_crashes():
            cache = {"type_k": GGML_TYPE_Q8_0, "type_v": GGML_TYPE_Q8_0} if runtime_attention and not gpu_layers else {}
            self.llm = Llama(
                model_path=gguf, n_ctx=context_length, n_threads=threads,
                n_gpu_layers=gpu_layers,  # on the GPU exactly when Tandem's target is
                flash_attn=runtime_attention,  # llama-cpp-python's default is off
                seed=seed, verbose=False, **cache,
            )

    def generate(self, prompt: str, max_new_tokens: int) -> tuple[int, ...]:
        self.llm.reset()  # no reuse of another run's prefill
        reply = self.llm.create_chat_completion(
            messages=[{"role": "user", "content": prompt}], max_tokens=max_new_tokens, **self.sampling
        )
        text = reply["choices"][0]["message"]["content"] or ""
        return tuple(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))


@contextmanager
def _plain_buffers_where_repacking_crashes() -> Iterator[None]:
    """`Llama` builds its own model parameters; where repacking crashes (cpu.py), make the
    defaults it starts from use the plain CPU buffers while it loads."""
    import llama_cpp.llama as llama_module

    if not repacking_crashes():
        yield
        return
    default_params = llama_module.llama_cpp.llama_model_default_params

    def plain_buffers():
        params = default_params()
        params.use_extra_bufts = False
        return params

    llama_module.llama_cpp.llama_model_default_params = plain_buffers
    try:
        yield
    finally:
        llama_module.llama_cpp.llama_model_default_params = default_params

"""Runtimes: the models behind the one contract the decoding algorithms use (`ModelRuntime`).

`ModelRuntime` is imported on first use rather than here, so that a llama.cpp worker process
(`llamacpp_worker`) can import the torch-free runtime modules without loading torch."""

__all__ = ["ModelRuntime"]


def __getattr__(name: str):
    if name == "ModelRuntime":
        from .base import ModelRuntime

        return ModelRuntime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

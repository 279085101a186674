"""Runtimes: the models behind the one contract the decoding algorithms use (`ModelRuntime`)."""
from .base import ModelRuntime

__all__ = ["ModelRuntime"]

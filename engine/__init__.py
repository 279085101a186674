"""Tandem's engine: models and speculative decoding. Runs headless; never imports Qt."""

__version__ = "0.1.0"

"""Tandem's engine: models and speculative decoding. Runs headless; never imports Qt."""

"""Tandem's desktop app: a PySide6 skin over the engine."""

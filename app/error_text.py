"""Engine errors as sentences for the window."""
from __future__ import annotations

from engine.config import ConfigError
from engine.errors import (
    ContextOverflowError,
    IncompatiblePairError,
    ModelLoadError,
    OutOfMemoryError,
    TandemError,
)

HEADINGS = (
    (ContextOverflowError, "The conversation does not fit in the model's context"),
    (OutOfMemoryError, "Out of memory"),
    (IncompatiblePairError, "These models cannot work as a pair"),
    (ModelLoadError, "The model could not be loaded"),
    (ConfigError, "A setting cannot be used"),
)


def error_text(error: BaseException) -> str:
    """What went wrong, in words; the engine's own message already says what to do."""
    for kind, heading in HEADINGS:
        if isinstance(error, kind):
            return f"{heading}: {error}"
    if isinstance(error, TandemError):
        return str(error)
    return f"Unexpected {type(error).__name__}: {error}"

"""Errors the engine reports to its callers. Each message is written for the person using
the app: it says what went wrong and, where there is one, what to do about it."""


class ConfigError(ValueError):
    """A setting or pair description that cannot be used; the message says which and why."""


class TandemError(Exception):
    """Base of every error the engine raises on purpose."""


class ModelLoadError(TandemError):
    """A model could not be found, read or loaded (missing file, corrupt file, offline)."""


class IncompatiblePairError(TandemError):
    """A draft whose tokenizer differs from its target's."""


class PromptError(TandemError):
    """A prompt that cannot be generated from (empty, or longer than the context)."""


class ContextOverflowError(PromptError):
    """The newest message alone does not fit in the model's context."""


class OutOfMemoryError(TandemError):
    """The device ran out of memory while loading or generating."""

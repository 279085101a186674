"""What one request may ask of the server. Imports nothing heavy: `tandem --help` reads the
defaults before torch is loaded."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class ServerLimits:
    # A chat of a few hundred thousand characters fits; a body larger than any context is refused unread.
    max_body_bytes: int = 1 << 20
    # The most tokens one reply may ask for (`max_tokens`), and what it gets when it asks for none.
    max_tokens: int = 2048
    # Requests waiting for the engine beyond the one it runs; more are refused with 503, not queued for minutes.
    max_waiting: int = 32

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_tokens", "max_waiting"):
            if getattr(self, name) < 1:
                raise ConfigError(f"the server's {name} must be at least 1")

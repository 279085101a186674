"""Serving a loaded pair with uvicorn, for `tandem serve` (engine/cli.py)."""
from __future__ import annotations

import sys

import uvicorn

from ..config import PairConfig
from ..session import LoadedPair
from .app import create_app
from .limits import ServerLimits
from .pair_host import PairHost

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def serve(pair: LoadedPair | PairConfig, host: str, port: int, api_key: str | None, limits: ServerLimits) -> int:
    """Serve until Ctrl-C; the pair is closed at the end. Given a config, the worker thread
    loads it once the server runs (PairHost.load_first says why)."""
    if host not in LOOPBACK and not api_key:
        print(f"  warning: serving on {host} without an API key: anyone who can reach this machine can use it "
              "(--api-key or TANDEM_API_KEY sets one)", file=sys.stderr)
    pairs = PairHost(pair)
    app = create_app(pairs, api_key, limits)
    where = f"http://{host}:{port}/v1"
    name = pair.name if isinstance(pair, PairConfig) else pair.config.name
    print(f"  serving {name} at {where} (OpenAI-compatible; Ctrl-C stops)", file=sys.stderr)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
    finally:
        pairs.close()
    return 0

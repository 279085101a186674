"""`tandem serve`'s app run by uvicorn in a thread, on a free port of the loopback interface only."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from engine.serve.app import Api, create_app
from engine.serve.limits import ServerLimits
from engine.serve.pair_host import PairHost


@contextlib.contextmanager
def running_server(pairs: PairHost, api_key: str | None = None, limits: ServerLimits = ServerLimits()) -> Iterator[tuple[str, Api]]:
    """Yields the server's base URL (http://127.0.0.1:PORT) and its Api (the queue's counters)."""
    app = create_app(pairs, api_key, limits)
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, name="test-uvicorn")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app.state.api
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()
        assert not thread.is_alive(), "the test server did not stop"

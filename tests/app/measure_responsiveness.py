"""Measure how late the GUI thread's event loop runs while the real demo pair writes long
replies (the figure quoted in docs/GUI.md).

    .venv/bin/python -m tests.app.measure_responsiveness [max_new_tokens]
"""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QEventLoop
from PySide6.QtWidgets import QApplication

from tests.app.scratch_home import use_scratch_home

from tests.app.probe import INTERVAL_MS, EventLoopProbe

PROMPT = "Write a detailed story about a lighthouse keeper who finds a message in a bottle."


def wait_for(signal) -> None:
    """Run the GUI event loop, idle between events as the app's own loop is, until `signal`."""
    loop = QEventLoop()
    signal.connect(loop.quit)
    loop.exec()
    signal.disconnect(loop.quit)


def main() -> int:
    max_new_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    use_scratch_home("tandem-probe-")

    from app.engine_api import LocalEngine
    from app.main_window import MainWindow
    from engine.config import DecodeSettings

    app = QApplication(sys.argv[:1])
    window = MainWindow(LocalEngine())
    window.resize(1280, 800)
    window.show()
    try:
        if window.client.pair is None:
            wait_for(window.client.pair_loaded)
        finished: list = []
        window.client.finished.connect(lambda _id, event, _description: finished.append(event))
        for method in ("chain", "ar"):
            window.set_decoding(DecodeSettings(method=method, max_new_tokens=max_new_tokens))
            window.controller.new_conversation()
            probe = EventLoopProbe()
            probe.start()
            window.pane.input.setPlainText(PROMPT)
            window.pane.send_button.click()
            started = time.perf_counter()
            wait_for(window.client.finished)
            probe.stop()
            event = finished.pop()
            print(
                f"{method}: {len(event.token_ids)} tokens in {time.perf_counter() - started:.1f} s "
                f"({event.stats.tokens_per_s:.1f} tok/s); {probe.ticks} probe ticks of {INTERVAL_MS} ms; "
                f"worst event-loop delay {probe.worst_delay_s * 1000:.1f} ms"
            )
    finally:
        window.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

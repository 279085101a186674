"""Settings → Local server: `tandem serve` for the active pair, run as a child process.

Why a child process and not a server thread in the app: the app's models run on its engine
thread, and a second thread running models in the same process ran at a third of its speed
(docs/BENCHMARKS.md, "On a busy machine", item 3: each thread keeps its own OpenMP team). A
child has its own, loads its own copy of the pair, and can be stopped without touching the
app's engine.

Nothing here blocks the window thread except `shutdown()`, which runs once, as the app closes:
the child is started with QProcess, its health is polled with QNetworkAccessManager, and a
stop is a terminate followed by a kill on a timer.
"""
from __future__ import annotations

import json
import sys
from collections import deque
from dataclasses import dataclass
from enum import Enum

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, QUrl, Signal, Slot
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

LOOPBACK = "127.0.0.1"  # the switch serves this machine only; `tandem serve --host` is for more
API_KEY_VARIABLE = "TANDEM_API_KEY"  # read by `tandem serve`; kept off the command line, where `ps` shows it
HEALTH_POLL_MS = 300
HEALTH_TIMEOUT_MS = 1000
STOP_GRACE_MS = 7000  # uvicorn gives open requests 5 s (engine/serve/command.py), then it is killed
KEPT_OUTPUT_LINES = 40


class ServerState(Enum):
    OFF = "off"
    STARTING = "starting"
    SERVING = "serving"
    STOPPED = "stopped"  # it ended without being asked to


@dataclass(frozen=True)
class ServerSpec:
    """What to serve: `pair` is a saved pair's name, or a JSON file describing one."""

    pair: str
    port: int
    api_key: str = ""

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/v1"


def serve_command_prefix() -> list[str]:
    """The program and first arguments that run the `tandem` command.

    A PyInstaller bundle's executable is Tandem itself, which dispatches subcommands
    (packaging/bundle_main.py); otherwise this interpreter runs the console script's
    function, engine.cli:main (there is no `python -m engine.cli`)."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-c", "import sys; from engine.cli import main; sys.exit(main())"]


def serve_arguments(spec: ServerSpec) -> list[str]:
    return ["serve", "--pair", spec.pair, "--host", LOOPBACK, "--port", str(spec.port)]


def reason_from_output(lines: list[str], exit_code: int, port: int) -> str:
    """Why the child ended, from what it wrote last: its last error line (uvicorn's "ERROR:"
    lines, `tandem: …`, a traceback's last line), else its last line, else its exit code.
    The commonest, a taken port, is said in words (uvicorn's line is in the tooltip)."""
    if any("address already in use" in line.lower() for line in lines):
        return f"port {port} is in use by another program"
    for line in reversed(lines):
        text = line.strip()
        if text.startswith("ERROR:"):
            return text.removeprefix("ERROR:").strip()
        if text.startswith("tandem:") or "Error:" in text or "error" in text.lower():
            return text
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    return last or f"it exited with code {exit_code}"


def status_text(state: ServerState, spec: ServerSpec | None, detail: str) -> str:
    """The status bar's line for the server; empty while it is off."""
    if state is ServerState.STARTING:
        return f"Local server: starting… {detail}".rstrip()
    if state is ServerState.SERVING and spec is not None:
        return f"Local server: {spec.url}"
    if state is ServerState.STOPPED:
        return f"Local server: stopped — {detail}"
    return ""


class LocalServer(QObject):
    """Keeps at most one `tandem serve` child running, as `run(spec)` last asked.

    A different spec (another pair, port or key) stops the child and starts the new one once
    the old one has freed its port; `run(None)` stops it."""

    changed = Signal()  # state, detail or spec changed: read `text()`

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.wanted: ServerSpec | None = None
        self.spec: ServerSpec | None = None  # what the running (or last) child serves
        self.state = ServerState.OFF
        self.detail = ""
        self.process: QProcess | None = None
        self._stopping = False  # the running child was asked to end: its exit is no failure
        self._output: deque[str] = deque(maxlen=KEPT_OUTPUT_LINES)
        self._network = QNetworkAccessManager(self)
        self._health_reply: QNetworkReply | None = None
        self._poll = QTimer(self)
        self._poll.setInterval(HEALTH_POLL_MS)
        self._poll.timeout.connect(self._check_health)
        self._kill_timer = QTimer(self)
        self._kill_timer.setSingleShot(True)
        self._kill_timer.setInterval(STOP_GRACE_MS)
        self._kill_timer.timeout.connect(self._kill)

    def text(self) -> str:
        return status_text(self.state, self.spec, self.detail)

    def output(self) -> str:
        """The child's last lines, for a tooltip."""
        return "\n".join(self._output)

    def run(self, spec: ServerSpec | None) -> None:
        """Serve `spec` (None: nothing). The same spec leaves a running child alone and
        restarts one that stopped (a port freed since, say)."""
        self.wanted = spec
        if self.process is not None:
            if self.spec != spec:
                self._stop()
        elif spec is not None:
            self._start(spec)
        elif self.state is not ServerState.OFF:
            self._set_state(ServerState.OFF, "")

    def pid(self) -> int | None:
        return self.process.processId() if self.process is not None else None

    def shutdown(self) -> None:
        """Stop the child and wait for it: the app is closing and must leave no orphan."""
        self.wanted = None
        process = self.process
        if process is None:
            return
        self._stopping = True
        process.terminate()
        if not process.waitForFinished(STOP_GRACE_MS):
            process.kill()
            process.waitForFinished(STOP_GRACE_MS)
        self._on_finished(process.exitCode(), process.exitStatus(), process)

    # The child

    def _start(self, spec: ServerSpec) -> None:
        process = QProcess(self)
        command = serve_command_prefix() + serve_arguments(spec)
        process.setProgram(command[0])
        process.setArguments(command[1:])
        environment = QProcessEnvironment.systemEnvironment()
        if spec.api_key:
            environment.insert(API_KEY_VARIABLE, spec.api_key)
        else:
            environment.remove(API_KEY_VARIABLE)  # no key in the settings means none, whatever the shell has
        process.setProcessEnvironment(environment)
        # One channel read as it comes: a full pipe would stall the child's logging.
        process.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        process.readyReadStandardOutput.connect(lambda: self._read_output(process))
        process.finished.connect(lambda code, status: self._on_finished(code, status, process))
        process.errorOccurred.connect(lambda error: self._on_error(error, process))
        self.process, self.spec, self._stopping = process, spec, False
        self._output.clear()
        self._set_state(ServerState.STARTING, "")
        process.start()
        self._poll.start()

    def _stop(self) -> None:
        """Ask the child to end; it is killed if it has not after STOP_GRACE_MS."""
        if self._stopping or self.process is None:
            return
        self._stopping = True
        self._poll.stop()
        self.process.terminate()
        self._kill_timer.start()

    @Slot()
    def _kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def _read_output(self, process: QProcess) -> None:
        text = bytes(process.readAllStandardOutput().data()).decode("utf-8", "replace")
        self._output.extend(line for line in text.splitlines() if line.strip())

    def _on_error(self, error: QProcess.ProcessError, process: QProcess) -> None:
        if error == QProcess.ProcessError.FailedToStart and process is self.process:
            # No `finished` follows a child that never started.
            self._forget(process)
            self._set_state(ServerState.STOPPED, f"could not start {process.program()}: {process.errorString()}")

    def _on_finished(self, exit_code: int, _status: QProcess.ExitStatus, process: QProcess) -> None:
        if process is not self.process:
            return  # already handled (shutdown waits, then Qt reports the same exit)
        self._read_output(process)
        expected = self._stopping
        self._forget(process)
        if not expected:
            self._set_state(ServerState.STOPPED, reason_from_output(list(self._output), exit_code, self.spec.port))
        elif self.wanted is not None:
            self._start(self.wanted)
        else:
            self._set_state(ServerState.OFF, "")

    def _forget(self, process: QProcess) -> None:
        self._poll.stop()
        self._kill_timer.stop()
        self.process = None
        self._stopping = False
        process.deleteLater()

    # Health

    @Slot()
    def _check_health(self) -> None:
        if self._health_reply is not None or self.spec is None:
            return  # one question at a time
        request = QNetworkRequest(QUrl(f"http://{LOOPBACK}:{self.spec.port}/health"))
        request.setTransferTimeout(HEALTH_TIMEOUT_MS)
        reply = self._network.get(request)
        self._health_reply = reply
        asked = self.process
        reply.finished.connect(lambda: self._on_health(reply, asked))

    def _on_health(self, reply: QNetworkReply, asked: QProcess | None) -> None:
        self._health_reply = None
        reply.deleteLater()
        if asked is None or asked is not self.process or self._stopping or self.state is not ServerState.STARTING:
            return
        if reply.error() != QNetworkReply.NetworkError.NoError:
            return  # not listening yet
        try:
            health = json.loads(bytes(reply.readAll().data()))
        except ValueError:
            return
        if not isinstance(health, dict):
            return
        if health.get("model"):
            self._poll.stop()
            self._set_state(ServerState.SERVING, "")
        elif self.detail == "":
            # `tandem serve` answers while its worker still loads the pair.
            self._set_state(ServerState.STARTING, "(loading the pair)")

    def _set_state(self, state: ServerState, detail: str) -> None:
        self.state, self.detail = state, detail
        self.changed.emit()

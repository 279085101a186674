"""Settings → Model pairs: the loaded pair's learned heads (SPRINTER's verifier and SpecDec++'s
acceptance head). Their held-out figures, and "Calibrate heads" with its progress and a Cancel.

The calibration runs on the engine thread (`EngineClient.calibrate`) for minutes; replies wait
meanwhile. Cancelled or failed, the pair keeps the heads it had.
"""
from __future__ import annotations

import html

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

from . import figures as fmt
from .error_text import error_text
from .worker import EngineClient, PairInfo

WHAT_IT_DOES = (
    "Calibrating has the target answer the shipped distillation prompts, then trains two small heads "
    "on the draft's hidden state to predict whether the target accepts each drafted token. It takes "
    "minutes (longest on a CPU), and replies wait meanwhile. Afterwards the toolbar's Verifier switch "
    "offers SPRINTER (approximate) and the method box the adaptive chain (SpecDec++, exact)."
)


class HeadsPanel(QGroupBox):
    def __init__(self, client: EngineClient):
        super().__init__("Learned heads of the pair in use (SPRINTER, SpecDec++)")
        self.client = client
        layout = QVBoxLayout(self)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.summary)
        row = QHBoxLayout()
        self.calibrate_button = QPushButton("Calibrate heads")
        self.progress = QProgressBar()
        self.progress.setTextVisible(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop calibrating; the pair keeps the heads it had")
        row.addWidget(self.calibrate_button)
        row.addWidget(self.progress, 1)
        row.addWidget(self.cancel_button)
        row.addStretch()
        layout.addLayout(row)
        self.outcome = QLabel()
        self.outcome.setObjectName("formNote")
        self.outcome.setWordWrap(True)
        layout.addWidget(self.outcome)

        self.calibrate_button.clicked.connect(self.calibrate)
        self.cancel_button.clicked.connect(self.cancel)
        client.calibration_progress.connect(self._on_progress)
        client.calibrated.connect(self._on_calibrated)
        client.calibration_cancelled.connect(self._on_cancelled)
        client.calibration_failed.connect(self._on_failed)
        client.busy_changed.connect(self.refresh)
        client.pair_loaded.connect(self.refresh)
        self.refresh()
        if client.calibration_step is not None:  # reopened while one runs
            self._on_progress(*client.calibration_step)

    @Slot()
    def calibrate(self) -> None:
        self._set_outcome("")
        self.client.calibrate()
        self.progress.setRange(0, 0)  # until the first report
        self.progress.setFormat("Starting…")

    @Slot()
    def cancel(self) -> None:
        self.client.cancel_calibration()
        self.cancel_button.setEnabled(False)
        self.progress.setFormat("Cancelling after the current step…")

    @Slot()
    def refresh(self) -> None:
        info, client = self.client.pair, self.client
        self.summary.setText(_summary(info))
        running = client.calibrating
        self.progress.setVisible(running)
        self.cancel_button.setVisible(running)
        if not running:
            self.cancel_button.setEnabled(True)  # for the next calibration
        self.calibrate_button.setVisible(not running)
        why_not = _why_not_calibrate(client)
        self.calibrate_button.setEnabled(why_not is None)
        self.calibrate_button.setText("Calibrate again" if info is not None and info.heads_card else "Calibrate heads")
        self.calibrate_button.setToolTip(why_not or WHAT_IT_DOES)

    @Slot(str, int, int)
    def _on_progress(self, phase: str, done: int, total: int) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        if self.cancel_button.isEnabled():
            self.progress.setFormat(fmt.calibration_step(phase, done, total))

    @Slot(object)
    def _on_calibrated(self, _info: PairInfo) -> None:
        self.cancel_button.setEnabled(True)
        self._set_outcome("Calibrated and saved. SPRINTER (approximate) is now on the toolbar's Verifier switch.")
        self.refresh()

    @Slot()
    def _on_cancelled(self) -> None:
        self.cancel_button.setEnabled(True)
        self._set_outcome("Calibration cancelled; nothing was saved and the pair keeps what it had.")
        self.refresh()

    @Slot(object)
    def _on_failed(self, error: Exception) -> None:
        self.cancel_button.setEnabled(True)
        self._set_outcome(f"Calibration failed: {error_text(error)} The pair keeps what it had.", failed=True)
        self.refresh()

    def _set_outcome(self, text: str, failed: bool = False) -> None:
        self.outcome.setText(text)
        self.outcome.setObjectName("formError" if failed else "formNote")
        self.outcome.style().unpolish(self.outcome)
        self.outcome.style().polish(self.outcome)


def _why_not_calibrate(client: EngineClient) -> str | None:
    info = client.pair
    if info is None:
        return "No model pair is loaded yet."
    if info.config.draft is None:
        return f"The pair “{info.config.name}” drafts with n-grams: learned heads need a draft model."
    if client.loading is not None:
        return "Another pair is loading; calibrate once it is ready."
    if client.generating:
        return "A reply is being written; calibrate once it ends."
    return None


def _summary(info: PairInfo | None) -> str:
    if info is None:
        return "No model pair is loaded yet."
    name = html.escape(info.config.name)
    if info.config.draft is None:
        return f"“{name}” drafts with n-grams: SPRINTER and the adaptive chain need a draft model."
    card = info.heads_card
    if card is None:
        problem = f"{html.escape(info.heads_problem)} " if info.heads_problem else ""
        return f"<p>“{name}” has no calibrated heads. {problem}</p><p>{html.escape(WHAT_IT_DOES)}</p>"
    rows = "".join(
        f"<tr><td style='padding-right:12px'>{html.escape(what)}</td>"
        f"<td style='padding-right:12px'>{html.escape(greedy)}</td><td>{html.escape(sampled)}</td></tr>"
        for what, greedy, sampled in fmt.heads_rows(card)
    )
    temperature = card.get("data", {}).get("temperature")
    sampled_title = f"sampled (T {temperature:g})" if isinstance(temperature, (int, float)) else "sampled"
    return (
        f"<p>“{name}”: {html.escape(fmt.heads_data(card))}</p>"
        f"<table><tr><th></th><th align='left'>greedy</th><th align='left'>{sampled_title}</th></tr>{rows}</table>"
    )

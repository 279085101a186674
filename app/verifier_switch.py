"""The toolbar's "Verifier: Exact | SPRINTER (approximate)" switch.

Exact replies are checked token by token by the target (with the method in the method box);
SPRINTER replies let tokens its learned verifier passes go out unchecked. The switch only
offers SPRINTER when the loaded pair has calibrated heads, and says how to get them when not.
"""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QButtonGroup, QHBoxLayout, QLabel, QToolButton, QWidget

from engine import methods
from engine.heads.figures import sprinter_refusal as engine_refusal

from . import figures as fmt
from .worker import PairInfo

EXACT, SPRINTER = methods.EXACT_MODE, methods.SPRINTER_MODE
VERIFIER_MODES = methods.VERIFIER_MODES
LABELS = {EXACT: "Exact", SPRINTER: methods.label(SPRINTER)}

EXACT_TIP = (
    "Exact: the target checks every token, so replies follow the target's own distribution "
    "(with the method chosen in the method box)."
)
SPRINTER_TIP = (
    "SPRINTER (approximate): tokens that the pair's learned verifier passes go out without the "
    "target checking them. Fewer target calls, but a reply may differ from what the target alone would write."
)


def sprinter_refusal(info: PairInfo | None) -> str | None:
    """Why the loaded pair cannot reply with SPRINTER, and how to change that; None when it can."""
    if info is None:
        return "SPRINTER becomes available once a model pair with calibrated heads is loaded."
    return engine_refusal(info.config.name, info.config.draft is not None, info.heads_problem, info.methods)


class VerifierSwitch(QWidget):
    chosen = Signal(str)  # "exact" | "sprinter": the user clicked

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("verifierSwitch")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 0, 6, 0)
        layout.setSpacing(0)
        self.title = QLabel("Verifier ")
        layout.addWidget(self.title)
        self.buttons: dict[str, QToolButton] = {}
        self.group = QButtonGroup(self)
        self.group.setExclusive(True)
        for mode in VERIFIER_MODES:
            button = QToolButton()
            button.setObjectName(f"verifier{mode.capitalize()}")
            button.setText(LABELS[mode])
            button.setCheckable(True)
            button.clicked.connect(lambda _checked, mode=mode: self.chosen.emit(mode))
            self.group.addButton(button)
            self.buttons[mode] = button
            layout.addWidget(button)
        self.buttons[EXACT].setChecked(True)
        self.why_not: str | None = None

    @property
    def mode(self) -> str:
        return SPRINTER if self.buttons[SPRINTER].isChecked() else EXACT

    def show_state(self, mode: str, why_not: str | None, quality: dict | None = None) -> None:
        """Show the verifier the next reply uses; `why_not` says why SPRINTER cannot be chosen
        (the switch is then disabled), `quality` holds the heads' held-out figures."""
        self.why_not = why_not
        self.buttons[mode if why_not is None else EXACT].setChecked(True)
        self.setEnabled(why_not is None)
        if why_not is not None:
            tip = why_not
            self.buttons[EXACT].setToolTip(f"{EXACT_TIP}\n\n{why_not}")
            self.buttons[SPRINTER].setToolTip(why_not)
        else:
            held_out = (f"\n\nHeld-out figures of this pair's verifier, {quality['mode']} as replies are now: "
                        f"{fmt.quality_text(quality)}." if quality else "")
            tip = f"{EXACT_TIP}\n\n{SPRINTER_TIP}{held_out}"
            self.buttons[EXACT].setToolTip(EXACT_TIP)
            self.buttons[SPRINTER].setToolTip(SPRINTER_TIP + held_out)
        self.setToolTip(tip)
        self.title.setToolTip(tip)

"""The app's few style rules, for light and dark palettes alike."""
from __future__ import annotations

from PySide6.QtGui import QPalette


def stylesheet(palette: QPalette) -> str:
    dark = palette.window().color().lightness() < 128
    user_bubble = "#2b3a55" if dark else "#e7effc"
    code_background = "#1e1f22" if dark else "#f4f4f6"
    quiet = "#a0a4ab" if dark else "#5f6368"
    error_background = "#5c1f1f" if dark else "#fde7e7"
    error_border = "#b3261e"
    warning_background = "#4d3d12" if dark else "#fff4d6"
    failed = "#ff8a80" if dark else "#b3261e"
    # SPRINTER (approximate): amber, wherever it is chosen or shown.
    approximate_text = "#ffcc66" if dark else "#8a5a00"
    approximate_background = "#4d3d12" if dark else "#fff1c7"
    exact_background = "#1f4a2a" if dark else "#dff3df"
    return f"""
QFrame#userMessage {{ background: {user_bubble}; border-radius: 10px; }}
QFrame#assistantMessage {{ background: transparent; }}
QFrame#codeBlock {{ background: {code_background}; border: 1px solid palette(mid); border-radius: 6px; }}
QLabel#codeLanguage, QLabel#messageStatus, QLabel#figuresSummary, QLabel#formNote,
QLabel#chatPlaceholder, QLabel#editNotice, QLabel#limitNotice {{ color: {quiet}; }}
QLabel#messageStatus[failed="true"], QLabel#pickerStatus[failed="true"], QLabel#formError {{ color: {failed}; }}
QLabel#chatTitle {{ font-weight: bold; }}
QFrame#banner {{ background: {error_background}; border: 1px solid {error_border}; border-radius: 6px; margin: 4px 12px; }}
QFrame#banner[kind="warning"] {{ background: {warning_background}; border-color: #b08000; }}
QWidget#verifierSwitch QToolButton {{ border: 1px solid palette(mid); padding: 2px 8px; }}
QToolButton#verifierExact {{ border-top-left-radius: 4px; border-bottom-left-radius: 4px; }}
QToolButton#verifierSprinter {{ border-top-right-radius: 4px; border-bottom-right-radius: 4px; border-left: none; }}
QToolButton#verifierExact:checked {{ background: {exact_background}; }}
QToolButton#verifierSprinter:checked {{ background: {approximate_background}; color: {approximate_text}; }}
QLabel#verifierFigure[approximate="true"], QLabel#approximateBadge {{ color: {approximate_text}; font-weight: bold; }}
QLabel#approximateBadge {{ background: {approximate_background}; border: 1px solid {approximate_text};
    border-radius: 7px; padding: 0px 6px; }}
"""

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
    return f"""
QWidget#chatContainer {{ background: palette(base); }}
QFrame#userMessage {{ background: {user_bubble}; border-radius: 10px; }}
QFrame#assistantMessage {{ background: transparent; }}
QFrame#codeBlock {{ background: {code_background}; border: 1px solid palette(mid); border-radius: 6px; }}
QLabel#codeLanguage, QLabel#messageStatus, QLabel#figuresSummary, QLabel#formNote,
QLabel#chatPlaceholder, QLabel#editNotice {{ color: {quiet}; }}
QLabel#messageStatus[failed="true"], QLabel#pickerStatus[failed="true"], QLabel#formError {{ color: {failed}; }}
QLabel#chatTitle {{ font-weight: bold; }}
QFrame#banner {{ background: {error_background}; border: 1px solid {error_border}; border-radius: 6px; margin: 4px 12px; }}
QFrame#banner[kind="warning"] {{ background: {warning_background}; border-color: #b08000; }}
"""

"""View → Theme: light, dark, or whatever the desktop uses.

Light and dark are explicit palettes on Qt's Fusion style, which follows a palette on every
platform (the Windows and macOS styles draw some parts their own way). "System" puts back the
style and palette the application started with, noted the first time a theme is applied.
The app's style sheet (app/style.py) is built from the palette, so it is rebuilt each time.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from .style import stylesheet

SYSTEM, LIGHT, DARK = "system", "light", "dark"
TITLES = {SYSTEM: "System", LIGHT: "Light", DARK: "Dark"}
FUSION = "Fusion"

# (role, colour) for every role a widget reads; the disabled group only greys text.
_DARK_COLOURS = {
    QPalette.ColorRole.Window: "#2b2d31",
    QPalette.ColorRole.WindowText: "#e6e6e6",
    QPalette.ColorRole.Base: "#1f2023",
    QPalette.ColorRole.AlternateBase: "#2b2d31",
    QPalette.ColorRole.ToolTipBase: "#3a3d42",
    QPalette.ColorRole.ToolTipText: "#f0f0f0",
    QPalette.ColorRole.PlaceholderText: "#8c9096",
    QPalette.ColorRole.Text: "#e6e6e6",
    QPalette.ColorRole.Button: "#35373c",
    QPalette.ColorRole.ButtonText: "#e6e6e6",
    QPalette.ColorRole.BrightText: "#ff6b6b",
    QPalette.ColorRole.Light: "#4a4d53",
    QPalette.ColorRole.Midlight: "#3f4247",
    QPalette.ColorRole.Mid: "#5a5d63",
    QPalette.ColorRole.Dark: "#18191b",
    QPalette.ColorRole.Shadow: "#000000",
    QPalette.ColorRole.Highlight: "#3d6fb6",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#8ab4f8",
    QPalette.ColorRole.LinkVisited: "#c58af9",
}
_DARK_DISABLED_TEXT = "#7a7d83"


@dataclass(frozen=True)
class Look:
    style: str
    palette: QPalette


def _dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in _DARK_COLOURS.items():
        palette.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(_DARK_DISABLED_TEXT))
    return palette


def _system_look(app: QApplication) -> Look:
    """The style and palette the application started with (kept on the application itself,
    so that every window of the process restores the same one)."""
    look = getattr(app, "_tandem_system_look", None)
    if look is None:
        look = Look(app.style().name(), QPalette(app.palette()))
        app._tandem_system_look = look
    return look


def apply_theme(theme: str) -> None:
    """Restyle the whole application; widgets that paint with theme colours of their own
    (charts, the provenance legend, coloured replies) are told by the main window."""
    app = QApplication.instance()
    system = _system_look(app)
    style = system.style if theme not in (LIGHT, DARK) else FUSION
    if app.style().name().lower() != style.lower():  # a new style object re-polishes every widget
        app.setStyle(style)
    if theme == DARK:
        app.setPalette(_dark_palette())
    elif theme == LIGHT:
        app.setPalette(app.style().standardPalette())  # Fusion's own: light
    else:
        app.setPalette(system.palette)
    app.setStyleSheet(stylesheet(app.palette()))

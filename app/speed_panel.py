"""The speed panel: live figures of the reply being written, and the loaded pair's device and
memory. A dock widget, so it can be moved, floated or hidden.

It says which verifier wrote the reply (Exact, or SPRINTER (approximate)); for SPRINTER also
the share of tokens the target never saw, the rounds without a target call, and the held-out quality
of the pair's verifier (from its heads' card)."""
from __future__ import annotations

from PySide6.QtCharts import (
    QBarCategoryAxis,
    QBarSeries,
    QBarSet,
    QChart,
    QChartView,
    QLineSeries,
    QValueAxis,
)
from PySide6.QtCore import QMargins, QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QPainter, QPen
from PySide6.QtWidgets import QDockWidget, QFrame, QGridLayout, QLabel, QScrollArea, QSizePolicy, QVBoxLayout, QWidget

from engine.config import DecodeSettings
from engine.stats import GenerationStats

from . import figures as fmt
from .message_widget import is_dark
from .provenance import DARK_COLOURS, LIGHT_COLOURS

LIVE_INTERVAL_MS = 500  # live figures are shown at most this often (the engine sends them every 0.25 s)


class ShareBar(QWidget):
    """Draft time against target time, as one split bar in the provenance colours."""

    def __init__(self):
        super().__init__()
        self.share: float | None = None
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(160, 22)

    def set_share(self, share: float | None) -> None:
        self.share = share
        self.update()

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        colours = DARK_COLOURS if is_dark() else LIGHT_COLOURS
        area = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        painter.setPen(QPen(self.palette().mid().color()))
        if self.share is None:
            painter.drawRect(area)
            painter.setPen(self.palette().windowText().color())
            painter.drawText(area, Qt.AlignmentFlag.AlignCenter, "—")
            return
        split = area.width() * self.share
        painter.fillRect(QRectF(area.left(), area.top(), split, area.height()), QColor(colours["draft"]))
        painter.fillRect(QRectF(area.left() + split, area.top(), area.width() - split, area.height()), QColor(colours["target"]))
        painter.drawRect(area)
        painter.setPen(self.palette().windowText().color())
        painter.drawText(area, Qt.AlignmentFlag.AlignCenter, fmt.time_share({"draft_time_share": self.share}))


def _chart(dark: bool) -> QChart:
    chart = QChart()
    chart.setTheme(QChart.ChartTheme.ChartThemeDark if dark else QChart.ChartTheme.ChartThemeLight)
    chart.legend().hide()
    chart.setMargins(QMargins(2, 2, 2, 2))
    chart.setBackgroundRoundness(0)
    return chart


def _axis(title: str, maximum: float, label_format: str = "%.0f") -> QValueAxis:
    axis = QValueAxis()
    axis.setRange(0, maximum)
    axis.setLabelFormat(label_format)
    axis.setTitleText(title)
    font = QFont(axis.labelsFont())
    font.setPointSizeF(max(font.pointSizeF() - 1, 6))
    axis.setLabelsFont(font)
    axis.setTitleFont(font)
    axis.setTickCount(3)
    return axis


class SpeedPanel(QDockWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__("Speed", parent)
        self.setObjectName("speedPanel")  # saveState() finds docks by name
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(8, 6, 8, 8)
        layout.setSpacing(6)

        self.speed = QLabel("—")
        self.speed.setObjectName("speedFigure")
        big = QFont(self.speed.font())
        big.setPointSizeF(big.pointSizeF() * 1.8)
        big.setBold(True)
        self.speed.setFont(big)
        self.speed.setToolTip(fmt.FIGURE_TIPS["speed"])
        self.caption = QLabel("Send a message to see live figures.")
        self.caption.setWordWrap(True)
        layout.addWidget(self.speed)
        layout.addWidget(self.caption)

        dark = is_dark()
        self.rate_series = QLineSeries()
        rate_chart = _chart(dark)
        rate_chart.addSeries(self.rate_series)
        self.time_axis = _axis("seconds", 1.0, "%.1f")
        self.rate_axis = _axis("tok/s", 10.0)
        rate_chart.addAxis(self.time_axis, Qt.AlignmentFlag.AlignBottom)
        rate_chart.addAxis(self.rate_axis, Qt.AlignmentFlag.AlignLeft)
        self.rate_series.attachAxis(self.time_axis)
        self.rate_series.attachAxis(self.rate_axis)
        self.rate_view = QChartView(rate_chart)
        self.rate_view.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.rate_view.setMinimumSize(220, 130)
        self.rate_view.setToolTip("Reply speed while it was written (tokens per second, over seconds since the first token)")
        layout.addWidget(self.rate_view)

        # A grid, not a QFormLayout: the form gave wrapped values the height of a wider column,
        # cutting off their last line in a narrow panel.
        grid = QGridLayout()
        grid.setColumnStretch(1, 1)
        grid.setHorizontalSpacing(10)
        self.names: dict[str, QLabel] = {}
        self.values: dict[str, QLabel] = {}
        for key, title in (
            ("verifier", "Verifier"),
            ("unchecked", "Unchecked tokens"),
            ("skipped", "Rounds without a target call"),
            ("quality", "Held-out quality"),
            ("first_token", "First token"),
            ("acceptance", "Acceptance"),
            ("per_call", "Tokens per target call"),
            ("saved", "Target calls saved"),
            ("mode", "Decoding"),
            ("device", "Device"),
            ("runtime", "Runtime"),
            ("memory", "Memory in use"),
        ):
            value = QLabel("—")
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.values[key] = value
            self._add_row(grid, key, title, value)
        self.values["verifier"].setObjectName("verifierFigure")
        self.share_bar = ShareBar()
        self._add_row(grid, "time_share", "Draft / target time", self.share_bar)
        layout.addLayout(grid)

        position_title = QLabel("Acceptance by draft position")
        position_title.setToolTip(fmt.FIGURE_TIPS["by_position"])
        layout.addWidget(position_title)
        self.position_set = QBarSet("accepted")
        self.position_set.setColor(QColor((DARK_COLOURS if dark else LIGHT_COLOURS)["draft"]).darker(130))
        self.position_series = QBarSeries()
        self.position_series.append(self.position_set)
        position_chart = _chart(dark)
        position_chart.addSeries(self.position_series)
        self.position_axis = QBarCategoryAxis()
        self.percent_axis = _axis("%", 100.0)
        position_chart.addAxis(self.position_axis, Qt.AlignmentFlag.AlignBottom)
        position_chart.addAxis(self.percent_axis, Qt.AlignmentFlag.AlignLeft)
        self.position_series.attachAxis(self.position_axis)
        self.position_series.attachAxis(self.percent_axis)
        self.position_view = QChartView(position_chart)
        self.position_view.setRenderHint(QPainter.RenderHint.Antialiasing)
        self.position_view.setMinimumSize(220, 120)
        self.position_view.setToolTip(fmt.FIGURE_TIPS["by_position"])
        layout.addWidget(self.position_view)
        layout.addStretch()
        # A short window scrolls the figures instead of squeezing the charts and rows into each other.
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(body)
        self.setWidget(scroll)
        self.charts = (rate_chart, position_chart)
        self._last_point = (0.0, 0)
        self._heads_card: dict | None = None
        self._latest: tuple[GenerationStats, dict] | None = None  # live figures not shown yet
        self._live_timer = QTimer(self, singleShot=True, interval=LIVE_INTERVAL_MS)
        self._live_timer.timeout.connect(self._show_latest)
        self._show_sprinter_rows(False)

    def set_pair(self, description: dict) -> None:
        self.values["device"].setText(
            f"{description.get('device', '?')}, {description.get('precision', '?')}"
        )
        self.values["runtime"].setText(description.get("runtime", "torch"))
        self.values["runtime"].setToolTip(runtime_tip(description))
        self.values["memory"].setText(fmt.memory(description.get("memory_mb")))

    def _add_row(self, grid: QGridLayout, key: str, title: str, value: QWidget) -> None:
        """One figure: its name and its value, both explaining it in one sentence on hover."""
        name = QLabel(title)
        name.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        row = grid.rowCount()
        grid.addWidget(name, row, 0)
        grid.addWidget(value, row, 1)
        for part in (name, value):
            part.setToolTip(fmt.FIGURE_TIPS[key])
        self.names[key] = name

    def set_dark(self, dark: bool) -> None:
        """The theme changed: the charts and the share bar take its colours."""
        for chart in self.charts:
            chart.setTheme(QChart.ChartTheme.ChartThemeDark if dark else QChart.ChartTheme.ChartThemeLight)
        self.position_set.setColor(QColor((DARK_COLOURS if dark else LIGHT_COLOURS)["draft"]).darker(130))
        for axis in (self.time_axis, self.rate_axis, self.percent_axis):  # setTheme resets their fonts
            font = QFont(axis.labelsFont())
            font.setPointSizeF(max(QFont().pointSizeF() - 1, 6))
            axis.setLabelsFont(font)
            axis.setTitleFont(font)
        self.share_bar.update()

    def set_heads(self, card: dict | None) -> None:
        """The loaded pair's heads card, whose held-out figures SPRINTER replies are shown with."""
        self._heads_card = card

    def _show_sprinter_rows(self, shown: bool) -> None:
        for key in ("unchecked", "skipped", "quality"):
            self.names[key].setVisible(shown)
            self.values[key].setVisible(shown)

    def _show_verifier(self, exact: bool) -> None:
        label = self.values["verifier"]
        if label.property("approximate") == (not exact) and self.names["unchecked"].isVisibleTo(self) == (not exact):
            return  # as shown: re-polishing the style with every update was most of an update's cost
        label.setText(fmt.EXACT_VERIFIER if exact else fmt.SPRINTER_VERIFIER)
        label.setProperty("approximate", not exact)
        label.style().unpolish(label)
        label.style().polish(label)
        self._show_sprinter_rows(not exact)

    def start_reply(self, settings: DecodeSettings, verifier_label: str) -> None:
        self._latest = None
        self.rate_series.clear()
        self.time_axis.setRange(0, 1.0)
        self.rate_axis.setRange(0, 10.0)
        self._last_point = (0.0, 0)
        self.speed.setText("…")
        self.caption.setText("Waiting for the first token")
        for key in ("first_token", "acceptance", "per_call", "saved", "unchecked", "skipped"):
            self.values[key].setText("—")
        self.values["mode"].setText(fmt.decoding_mode(settings.to_dict(), verifier_label))
        self._show_verifier(settings.exact)
        self.values["quality"].setText(fmt.quality_text(fmt.sprinter_quality(self._heads_card, settings.greedy)))
        self.share_bar.set_share(None)
        self._set_positions([])

    def show_reading(self, fraction: float, seconds_left: float | None = None) -> None:
        """A long prompt is being read: the wait before the first token, how far it got, and
        about how long it has left."""
        self.caption.setText(fmt.reading(fraction, seconds_left))

    def show_live_stats(self, stats: GenerationStats, description: dict) -> None:
        """Figures of the reply being written: shown at most every LIVE_INTERVAL_MS, the latest
        of them (the panel is read, not watched frame by frame, and every showing re-lays its
        rows out and repaints its charts on the window's thread)."""
        self._latest = (stats, description)
        if not self._live_timer.isActive():
            self._live_timer.start()
            self._show_latest()

    def _show_latest(self) -> None:
        if self._latest is not None:
            stats, description = self._latest
            self._latest = None
            self.update_stats(stats, description)

    def update_stats(self, stats: GenerationStats, description: dict) -> None:
        figures = stats.to_dict()
        self.speed.setText(fmt.rate(stats.tokens_per_s))
        self.caption.setText(f"{stats.tokens_generated} tokens in {stats.elapsed_s:.1f} s, {fmt.method_title(stats.method)}")
        self.values["first_token"].setText(fmt.seconds(stats.time_to_first_token_s))
        self._show_verifier(stats.exact)
        if not stats.exact:
            self.values["unchecked"].setText(fmt.unchecked(figures))
            self.values["skipped"].setText(fmt.calls_skipped(figures))
        if stats.method == "ar":
            for key in ("acceptance", "per_call", "saved"):
                self.values[key].setText("— (ar drafts nothing)")
        else:
            checked = "drafted" if stats.exact else "flagged tokens checked"
            self.values["acceptance"].setText(
                f"{fmt.percent(stats.acceptance_rate)} of {stats.draft_tokens_proposed} {checked}"
            )
            self.values["per_call"].setText(fmt.ratio(stats.mean_accepted_per_target_call))
            self.values["saved"].setText(fmt.calls_saved(figures))
        self.share_bar.set_share(stats.draft_time_share)
        self._set_positions(stats.acceptance_by_position)
        self._add_rate_point(stats.elapsed_s, stats.tokens_generated)
        self.set_pair(description)

    def finish_reply(self, stats: GenerationStats, description: dict, stop_reason: str) -> None:
        self._latest = None  # the final figures replace any live ones still waiting
        self.update_stats(stats, description)
        self.caption.setText(
            f"Last reply: {stats.tokens_generated} tokens in {stats.elapsed_s:.1f} s, "
            f"{fmt.STOP_REASONS.get(stop_reason, stop_reason)}" + (f". {stats.note[0].upper()}{stats.note[1:]}." if stats.note else "")
        )

    def fail_reply(self) -> None:
        """The reply ended in an error: stop waiting for figures that will not come."""
        self._latest = None
        self.speed.setText("—")
        self.caption.setText("The last reply failed; its error is shown above the chat")

    def _add_rate_point(self, elapsed: float, tokens: int) -> None:
        """Plot the rate since the previous update: the curve shows slow and fast stretches."""
        last_elapsed, last_tokens = self._last_point
        if elapsed <= last_elapsed or tokens <= last_tokens:
            return
        rate = (tokens - last_tokens) / (elapsed - last_elapsed)
        self._last_point = (elapsed, tokens)
        self.rate_series.append(elapsed, rate)
        self.time_axis.setRange(0, max(1.0, elapsed * 1.05))
        if rate * 1.15 > self.rate_axis.max():
            self.rate_axis.setRange(0, rate * 1.15)

    def _set_positions(self, rates: list[float]) -> None:
        categories = [str(index) for index in range(1, len(rates) + 1)]
        if categories != self.position_axis.categories():
            self.position_axis.clear()
            self.position_axis.append(categories or [""])
        if self.position_set.count() != len(rates):
            self.position_set.remove(0, self.position_set.count())
            self.position_set.append([value * 100 for value in rates])
        else:
            for index, value in enumerate(rates):
                self.position_set.replace(index, value * 100)


def runtime_tip(description: dict) -> str:
    """The runtime's hover text: what a runtime is, the forward the engine planned for the
    target (which engine runs which rows, and why) and what `tandem tune` chose, where known."""
    parts = [fmt.FIGURE_TIPS["runtime"]]
    if description.get("forward_plan"):
        parts.append(f"Forward plan: {description['forward_plan']}")
    if description.get("runtime_choice"):
        parts.append(f"Chosen by measurement: {description['runtime_choice']}")
    return "\n\n".join(parts)

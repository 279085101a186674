"""`tandem chat`: a conversation in the terminal, streamed, with a live stats line.

On a terminal the last screen row is kept for the stats (a scroll region covers the rest),
and messages are typed in a raw-mode line editor (engine/terminal_editor.py); when output
is piped, the stats follow each reply as a plain line instead, and piped input is read a
line per message.

`/verifier exact|sprinter` is the app's Verifier switch: SPRINTER (approximate) replaces the
method until `/verifier exact` brings the exact one back; it needs the pair's calibrated heads.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
from collections.abc import Callable
from typing import TextIO

from .chat_prompt import Message, reply_to_continue
from . import methods
from .config import ConfigError, DecodeSettings
from .errors import TandemError
from .events import Finished, PromptPrepared, PromptProgress, StatsUpdate, TextDelta
from .heads.figures import describe_sprinter, sprinter_figures, sprinter_refusal
from .session import LoadedPair, method_refusal
from .stats import GenerationStats
from . import terminal_editor
from .terminal_input import MessageReader

HELP = f"""Commands: /reset (new conversation), /system TEXT,
/method {"|".join(methods.NAMES)} (what this pair cannot run, it says why),
/verifier exact|sprinter (SPRINTER is approximate: tokens its learned verifier passes are not checked
by the target; it needs the pair's calibrated heads: tandem calibrate --pair NAME),
/temperature T (0 is greedy: the same reply every time), /continue (write more of a reply the token
limit stopped), /stats (last reply's figures), /help, /quit.
A message can span lines: paste them (a paste is one message, sent when you press Enter), end a line
with \\ to go on with the next, or put the lines between two lines of \"\"\". What you type while a
reply streams waits, unechoed, for the next message.
Ctrl-C stops a reply; Ctrl-L clears the screen; Ctrl-D quits."""

# Why `/continue` wrote nothing, by how the generation ended ("stopped" says so itself)
NOTHING_MORE = {
    "eos": "the model ends its reply there; ask something to go on",
    "context": "the conversation fills the model's context; /reset starts a new one",
}


def stats_line(stats: GenerationStats) -> str:
    parts = [f"{stats.method}", f"{stats.tokens_per_s:.1f} tok/s", f"{stats.tokens_generated} tokens"]
    if stats.time_to_first_token_s is not None:
        parts.append(f"first token {stats.time_to_first_token_s * 1000:.0f} ms")
    if stats.acceptance_rate is not None:
        parts.append(f"accepted {stats.acceptance_rate:.0%}")
    if stats.mean_accepted_per_target_call is not None:
        parts.append(f"{stats.mean_accepted_per_target_call:.2f} tok/target call")
    if not stats.exact:
        parts.append(f"approximate: unchecked tokens {stats.unchecked_tokens}, "
                      f"target calls skipped {stats.target_calls_skipped}")
    return " · ".join(parts)


def temperature_label(temperature: float) -> str:
    return f"{temperature:g} (greedy)" if temperature == 0 else f"{temperature:g}"


class StatusLine:
    """The bottom terminal row, updated in place while the text above scrolls."""

    def __init__(self, stream: TextIO, stderr: TextIO = sys.stderr):
        self.stream = stream
        self.stderr = stderr
        self.live = stream.isatty()
        self.rows = terminal_size(stream).lines
        self.text = ""

    def __enter__(self) -> StatusLine:
        if self.live:
            self.stream.write(f"\n{self._scroll_region()}\033[{self.rows - 1};1H")
        return self

    def __exit__(self, *exc_info) -> None:
        if self.live:
            self.stream.write(f"\0337\033[{self.rows};1H\033[2K\0338\033[r")  # clear it, restore full-screen scrolling
            self.stream.flush()

    def _scroll_region(self) -> str:
        return f"\033[1;{self.rows - 1}r"  # every row but the last scrolls

    def show(self, text: str) -> None:
        self.text = text
        if not self.live:
            return
        size = terminal_size(self.stream)
        region = ""
        if size.lines != self.rows:  # the window was resized: move the status row to its new bottom
            self.rows = size.lines
            region = f"\0337{self._scroll_region()}\0338"
        # One column short of the width: a character in the last column leaves some terminals
        # waiting to wrap, and the next write would scroll the screen.
        shown = fit_width(f" {text} ", size.columns - 1)
        self.stream.write(f"{region}\0337\033[{self.rows};1H\033[2K\033[7m{shown}\033[0m\033[K\0338")
        self.stream.flush()

    def clear_screen(self) -> None:
        """Ctrl-L: a blank screen with the status row drawn again, the cursor at the top."""
        if self.live:
            self.stream.write("\033[2J\033[H")
            self.show(self.text)

    def progress(self, text: str, done: bool) -> None:
        """How far a long wait got: on the status row, or, with the output piped, on a line
        of the terminal's stderr that is rewritten in place and kept once `done`."""
        if self.live:
            self.show(text)
        elif self.stderr.isatty():
            self.stderr.write(f"\r{text}\033[K" + ("\n" if done else ""))
            self.stderr.flush()

    def after_reply(self, text: str) -> None:
        if not self.live:
            self.stream.write(f"[{text}]\n")


def terminal_size(stream: TextIO) -> os.terminal_size:
    """The size of the terminal `stream` writes to (the terminal's own, TIOCGWINSZ), or the
    environment's guess when it has none."""
    try:
        return os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not a file, or not a terminal
        return shutil.get_terminal_size()


def fit_width(text: str, columns: int) -> str:
    """`text` cut to `columns` characters, the cut marked with an ellipsis."""
    if len(text) <= columns:
        return text
    return text[: max(columns - 1, 0)] + "…" if columns > 0 else ""


class TerminalChat:
    def __init__(self, pair: LoadedPair, settings: DecodeSettings, system_prompt: str | None,
                 read: Callable[[str], str] | None = None, out: TextIO = sys.stdout, stderr: TextIO = sys.stderr,
                 stdin: TextIO = sys.stdin):
        self.pair = pair
        self.settings = settings
        self.system_prompt = system_prompt
        self.history: list[Message] = []
        self.read = read  # one message per call, however many lines; by default from `stdin`
        self.out = out
        self.stderr = stderr
        self.stdin = stdin
        self.last_stats: GenerationStats | None = None
        # What `/verifier exact` goes back to: the last exact method in use.
        self.exact_method = settings.method if settings.exact else methods.default_method(pair.methods)
        # Set on the compile's thread when a runtime's background compile ends; the chat's own
        # thread then measures again what it changed, before the next reply.
        self.background_work_ended = threading.Event()
        if pair.has_background_work:
            pair.when_background_work_changes(self.background_work_ended.set)

    def run(self) -> int:
        described = self.pair.describe()
        self.out.write(f"Tandem · {described['target']} drafted by {described['draft']} on {described['device']} "
                       f"({described['precision']}, {described['runtime']}), temperature {temperature_label(self.settings.temperature)}. "
                       "/help for commands and messages of several lines.\n")
        refusal = method_refusal(self.pair, self.settings.method)
        if refusal:
            self.settings = self.settings.with_changes(method=methods.default_method(self.pair.methods))
            self.out.write(f"[error] {refusal} Using {self.settings.method} instead.\n")
        elif not self.settings.exact:
            self.out.write(f"{self._verifier_line()}\n")
        with StatusLine(self.out, self.stderr) as status, self._input(status) as read:
            while True:
                try:
                    line = read("you> ")
                except EOFError:
                    self.out.write("\n")
                    return 0
                if not line.strip():
                    continue
                if line.startswith("/"):
                    if not self._command(line.strip(), status):
                        return 0
                    continue
                self._reply(line, status)

    @contextlib.contextmanager
    def _input(self, status: StatusLine):
        """The reader of messages: the one given, else a line editor in raw mode on a
        terminal, else lines as they come (piped input)."""
        if self.read is not None:
            yield self.read
        elif self.stdin.isatty() and self.out.isatty() and terminal_editor.available():
            editor = terminal_editor.LineEditor(self.stdin.fileno(), self.out, clear_screen=status.clear_screen)
            with editor.terminal_mode():
                yield editor
        else:
            yield MessageReader(self._read_piped_line, stream=self.stdin)

    def _read_piped_line(self, prompt: str) -> str:
        """A line of piped input, written after its prompt as a terminal would echo it, so
        that the transcript reads as a conversation and the reply starts on its own line."""
        self.out.write(prompt)
        line = self.stdin.readline()
        if not line:
            raise EOFError
        line = line.rstrip("\r\n")
        self.out.write(line + "\n")
        return line

    def _reply(self, text: str, status: StatusLine) -> None:
        self._write_reply(self.history + [Message("user", text)], status)

    def _continue(self, status: StatusLine) -> None:
        """`/continue`: the model carries on the last reply where the token limit stopped it;
        what it writes is added to that reply in the conversation."""
        carried_on = reply_to_continue(self.history)
        if carried_on is None:
            self.out.write("(there is no reply to continue)\n")
            return
        self._write_reply(self.history, status, carried_on)

    def _after_background_work(self) -> None:
        """Once a runtime's background compile has ended: measure again, and say what changed."""
        if self.background_work_ended.is_set():
            self.background_work_ended.clear()
            self.pair.after_background_work()
            self.out.write(f"[runtime: {self.pair.runtime_label}]\n")

    def _write_reply(self, messages: list[Message], status: StatusLine, carried_on: str | None = None) -> None:
        self._after_background_work()
        generation = self.pair.generate(messages, self.settings, self.system_prompt)
        self.out.write("tandem> " + ("… " if carried_on is not None else ""))
        finished = None
        try:
            for event in generation:
                if isinstance(event, PromptPrepared) and event.dropped_turns:
                    self.out.write(f"(the {event.dropped_turns} oldest messages no longer fit the context and were left out)\n")
                elif isinstance(event, PromptProgress):
                    status.progress(f"reading your message… {event.fraction:.0%}", event.fraction >= 1)
                elif isinstance(event, TextDelta):
                    self.out.write(event.text)
                    self.out.flush()
                elif isinstance(event, StatsUpdate):
                    status.show(stats_line(event.stats))
                elif isinstance(event, Finished):
                    finished = event
        except KeyboardInterrupt:
            # Ctrl-C lands inside a round or while printing: either way the generation is
            # over, and the reply streamed so far is kept, as in the app.
            finished = generation.result_so_far()
        except (TandemError, ConfigError) as error:  # no setting may end a chat
            self.out.write(f"\n[error] {error}\n")
            return
        if finished is None:
            return
        self.out.write("\n")
        if finished.stop_reason == "stopped":
            self.out.write("[stopped]\n")
        if carried_on is not None:
            self.history = messages[:-1] + [Message("assistant", carried_on + finished.text)]
            if not finished.token_ids and finished.stop_reason in NOTHING_MORE:
                self.out.write(f"(nothing more was written: {NOTHING_MORE[finished.stop_reason]})\n")
        elif finished.token_ids:
            self.history = messages + [Message("assistant", finished.text)]
        else:
            self.out.write("(no reply was written, so this message is not kept in the conversation)\n")
        if finished.stop_reason == "length" and finished.token_ids:
            self.out.write(f"[stopped at the {self.settings.max_new_tokens}-token limit: /continue writes more]\n")
        self.last_stats = finished.stats
        status.show(stats_line(finished.stats))
        status.after_reply(stats_line(finished.stats))

    def _command(self, line: str, status: StatusLine) -> bool:
        """Apply a slash command; False means quit."""
        name, _, argument = line.partition(" ")
        try:
            if name in ("/quit", "/exit"):
                return False
            if name == "/reset":
                self.history = []
                self.out.write("(new conversation)\n")
            elif name == "/system":
                self.system_prompt = argument or None
                self.out.write("(system prompt set)\n" if argument else "(system prompt cleared)\n")
            elif name == "/method":
                method = argument.strip()
                settings = self.settings.with_changes(method=method)  # an unknown name fails here
                refusal = method_refusal(self.pair, method)
                if refusal:
                    self.out.write(f"[error] {refusal} The method stays {self.settings.method}.\n")
                else:
                    self.settings = settings
                    if settings.exact:
                        self.exact_method = method
                    self.out.write(f"(method: {self.settings.method})\n")
            elif name == "/verifier":
                self._set_verifier(argument.strip().lower())
            elif name == "/temperature":
                self.settings = self.settings.with_changes(temperature=float(argument))
                self.out.write(f"(temperature: {temperature_label(self.settings.temperature)})\n")
            elif name == "/continue":
                self._continue(status)
            elif name == "/stats":
                self.out.write((stats_line(self.last_stats) if self.last_stats else "(no reply yet)") + "\n")
            else:
                self.out.write(HELP + "\n")
        except (ConfigError, ValueError) as error:
            self.out.write(f"[error] {error}\n")
        return True

    def _set_verifier(self, verifier: str) -> None:
        """`/verifier exact|sprinter`; with no argument, say which one replies use."""
        if verifier:
            try:
                method = methods.method_for_mode(self.exact_method, verifier)
            except ValueError as error:
                self.out.write(f"[error] {error}.\n")
                return
            pair = self.pair
            refusal = sprinter_refusal(pair.config.name, pair.has_draft_model, pair.heads_problem, pair.methods)
            if verifier == methods.SPRINTER_MODE and refusal:
                self.out.write(f"[error] {refusal} The verifier stays exact.\n")
                return
            self.settings = self.settings.with_changes(method=method)
        self.out.write(f"{self._verifier_line()}\n")

    def _verifier_line(self) -> str:
        if not self.settings.exact:
            figures = sprinter_figures(self.pair.heads.card if self.pair.heads else None, self.settings.greedy)
            return ("(verifier: SPRINTER, approximate: tokens its verifier passes go out without the target checking them; "
                    f"held out, it {describe_sprinter(figures)})")
        return f"(verifier: exact, method {self.settings.method})"

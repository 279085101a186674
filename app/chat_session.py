"""What happens in the chat pane: sending, streaming into the store and the view, stopping,
regenerating, editing the last question, and the conversation's system prompt."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from PySide6.QtCore import QObject, Signal, Slot

from engine.chat_prompt import INCOMPLETE_CHARACTER, Message
from engine.config import DecodeSettings
from engine.events import Finished, PromptPrepared, PromptProgress, TextDelta

from .chat_view import ChatPane
from .error_text import error_text
from .figures import reading, reply_figures, sprinter_quality
from .provenance import Runs, extend_runs, fit_runs, split_delta
from .reading_time import LONG_READ_S, ReadingClock, ReadingCost, ReadingCosts, chars_per_token, long_read_warning
from .storage import COMPLETE, EXACT, FAILED, STOPPED, STREAMING, ChatStore, StoredMessage
from .worker import EngineClient

# A streaming reply's text goes to the chats file this often, not with every delta: a SQLite
# commit (and the runs as JSON) per delta is work on the window's thread, and on a 2-core
# machine a core the window takes is one the engine's threads wait for. The reply's end
# (finished, stopped, failed, or the app closed) is always written at once.
STORE_INTERVAL_S = 1.0
NEW_TITLE = "New chat"
TITLE_LENGTH = 48


def title_from(text: str) -> str:
    first_line = text.strip().splitlines()[0] if text.strip() else NEW_TITLE
    return first_line if len(first_line) <= TITLE_LENGTH else first_line[: TITLE_LENGTH - 1].rstrip() + "…"


@dataclass
class Stream:
    """The reply being written: where it goes and what has arrived."""

    request_id: int
    message_id: int
    conversation_id: int
    settings: DecodeSettings
    verifier_label: str
    quality: dict | None = None  # an approximate reply's held-out verifier figures
    text: str = ""
    runs: Runs = field(default_factory=list)
    note: str = ""
    reading: bool = False  # a long prompt is being read: the status says how far
    pair_name: str = ""
    prompt_chars: int = 0  # the conversation's characters the prompt is made of
    chars_per_token: float | None = None  # of this prompt, once PromptPrepared told its tokens
    reading_clock: ReadingClock | None = None  # times a long prompt's reading
    carried_on: StoredMessage | None = None  # Continue: the reply as it was before this stream
    base_text: str = ""  # what this stream's text follows: the continued reply so far
    stored_at: float = field(default_factory=time.monotonic)  # when the chats file last got the text so far


class ChatController(QObject):
    conversations_changed = Signal()  # titles or order changed: the list should refresh
    reply_started = Signal(object, str)  # DecodeSettings, verifier label
    reading_progress = Signal(float, object)  # a long prompt's fraction read, seconds left or None

    def __init__(
        self,
        store: ChatStore,
        client: EngineClient,
        pane: ChatPane,
        decode_settings: Callable[[], DecodeSettings],
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.store = store
        self.client = client
        self.pane = pane
        self._decode_settings = decode_settings
        self.conversation_id: int | None = None
        self.stream: Stream | None = None
        self.editing: StoredMessage | None = None
        self.reading_costs = ReadingCosts(store)
        self._long_message_announced: str | None = None  # sent again unchanged, it goes
        # The conversation the engine read last: its caches hold that one's prompt, so a
        # message there is read alone, and one in another conversation with its history.
        self._last_read_conversation: int | None = None

        pane.send_requested.connect(self.send)
        pane.stop_requested.connect(self.stop)
        pane.edit_cancelled.connect(self.cancel_edit)
        pane.system_prompt_edited.connect(self.set_system_prompt)
        pane.view.regenerate_requested.connect(self.regenerate)
        pane.view.continue_requested.connect(self.continue_reply)
        pane.view.edit_requested.connect(self.start_edit)
        client.prompt_prepared.connect(self._on_prompt_prepared)
        client.prompt_progress.connect(self._on_prompt_progress)
        client.text_delta.connect(self._on_text_delta)
        client.finished.connect(self._on_finished)
        client.errored.connect(self._on_errored)
        client.busy_changed.connect(self.refresh_state)

    # Conversations

    def open_conversation(self, conversation_id: int | None) -> None:
        self.cancel_edit()
        conversation = self.store.conversation(conversation_id) if conversation_id is not None else None
        self.conversation_id = conversation.id if conversation else None
        if conversation is None:
            self.pane.show_conversation(NEW_TITLE, "", [])
        else:
            self.pane.show_conversation(conversation.title, conversation.system_prompt, self.store.messages(conversation.id))
            self.store.set_state("selected_conversation", str(conversation.id))
        self.refresh_state()

    def new_conversation(self) -> None:
        """An empty chat, stored with its first message or system prompt: clicking New chat
        never leaves empty conversations behind."""
        self.open_conversation(None)
        self.conversations_changed.emit()

    def rename(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title)
        if conversation_id == self.conversation_id:
            self.pane.title.setText(title)
        self.conversations_changed.emit()

    def delete(self, conversation_id: int) -> None:
        if self.stream is not None and self.stream.conversation_id == conversation_id:
            self.client.stop()
        self.store.delete_conversation(conversation_id)
        if conversation_id == self.conversation_id:
            remaining = self.store.list_conversations()
            self.open_conversation(remaining[0].id if remaining else None)
        self.conversations_changed.emit()

    @Slot(str)
    def set_system_prompt(self, text: str) -> None:
        if self.conversation_id is None:
            self.conversation_id = self.store.create_conversation(NEW_TITLE, text).id
            self.store.set_state("selected_conversation", str(self.conversation_id))
            self.conversations_changed.emit()
        else:
            self.store.set_system_prompt(self.conversation_id, text)

    # Sending and replies

    @Slot(str)
    def send(self, text: str) -> None:
        if not self.client.can_generate or not text.strip():
            return
        wait = self.reading_estimate(text)
        if wait is not None and wait > LONG_READ_S and text != self._long_message_announced:
            self._long_message_announced = text
            self.pane.show_long_read_notice(long_read_warning(wait))
            return
        self._long_message_announced = None
        if self.conversation_id is None:
            self.conversation_id = self.store.create_conversation(title_from(text)).id
            self.store.set_state("selected_conversation", str(self.conversation_id))
            self.pane.title.setText(title_from(text))
        elif self.editing is not None:
            self.store.delete_messages_from(self.editing)
            self.pane.view.remove_messages_from(self.editing.id)
            self.cancel_edit()
        conversation = self.store.conversation(self.conversation_id)
        if conversation.title == NEW_TITLE and not self.store.messages(conversation.id):
            self.rename(conversation.id, title_from(text))
        question = self.store.add_message(self.conversation_id, "user", text)
        self.pane.view.add_message(question)
        self.pane.input.clear()
        self._start_reply()
        self.conversations_changed.emit()

    def reading_estimate(self, text: str) -> float | None:
        """About how many seconds the models will read before replying to `text`, from the
        pair's measured reading cost; None before one was measured."""
        pair = self.client.pair
        cost = self.reading_costs.get(pair.config.name) if pair is not None else None
        if cost is None:
            return None
        earlier = 0
        if self.conversation_id is not None:
            conversation = self.store.conversation(self.conversation_id)
            earlier = len(conversation.system_prompt) + sum(len(m.content) for m in self.store.messages(conversation.id))
        if self.conversation_id != self._last_read_conversation:
            return cost.seconds_for(earlier + len(text))  # its models hold another chat: all of it is read
        return cost.seconds_for(len(text), characters_before=earlier)

    @Slot()
    def regenerate(self) -> None:
        if self.conversation_id is None or not self.client.can_generate:
            return
        messages = self.store.messages(self.conversation_id)
        if not messages or messages[-1].role != "assistant":
            return
        self.store.delete_messages_from(messages[-1])
        self.pane.view.remove_messages_from(messages[-1].id)
        self._start_reply()

    @Slot()
    def continue_reply(self) -> None:
        """Carry on the last reply where the token limit stopped it: the model reads the reply
        so far as the start of its own turn, and what it writes is added to the same message."""
        if self.conversation_id is None or not self.client.can_generate:
            return
        messages = self.store.messages(self.conversation_id)
        if not messages or messages[-1].role != "assistant" or not messages[-1].content.strip():
            return
        reply = messages[-1]
        settings = self._decode_settings()
        self.store.reopen_reply(reply.id, EXACT if settings.exact else settings.method)
        widget = self.pane.view.widget_for(reply.id)
        if widget is not None:
            widget.limit_notice.show_limit(None)
            widget.set_status(STREAMING)
            widget.show_verifier(self.store.message(reply.id).verifier)
        self._stream_into(reply.id, settings, carried_on=reply)

    @Slot()
    def stop(self) -> None:
        self.client.stop()

    @Slot(int)
    def start_edit(self, message_id: int) -> None:
        message = self.store.message(message_id)
        if message is None or message.role != "user":
            return
        self.editing = message
        self.pane.input.setPlainText(message.content)
        self.pane.input.setFocus()
        self.pane.edit_notice.setVisible(True)

    @Slot()
    def cancel_edit(self) -> None:
        if self.editing is not None:
            self.editing = None
            self.pane.input.clear()
        self.pane.edit_notice.setVisible(False)

    def _start_reply(self) -> None:
        settings = self._decode_settings()
        # An approximate reply is marked from its first row, so that one cut short still says so.
        verifier = EXACT if settings.exact else settings.method
        reply = self.store.add_message(self.conversation_id, "assistant", "", STREAMING, verifier=verifier)
        self.pane.view.add_message(reply)
        self._stream_into(reply.id, settings)

    def _stream_into(self, message_id: int, settings: DecodeSettings, carried_on: StoredMessage | None = None) -> None:
        """Ask the engine for a reply to the stored conversation, streamed into `message_id`
        (a new reply, or, with `carried_on`, the last reply, which the model continues)."""
        conversation = self.store.conversation(self.conversation_id)
        history = [
            Message(m.role, m.content)
            for m in self.store.messages(conversation.id)
            if m.content.strip() and m.status != FAILED
        ]
        pair = self.client.pair
        verifier_label = pair.verifier_label(settings.verifier) if pair else settings.verifier
        quality = None if settings.exact or pair is None else sprinter_quality(pair.heads_card, settings.greedy)
        request_id = self.client.generate(history, settings, conversation.system_prompt)
        self._last_read_conversation = conversation.id
        self.stream = Stream(
            request_id, message_id, conversation.id, settings, verifier_label, quality, carried_on=carried_on,
            pair_name=pair.config.name if pair else "",
            prompt_chars=len(conversation.system_prompt) + sum(len(m.content) for m in history),
        )
        if carried_on is not None:
            # A character the limit cut in two is written again, whole (chat_prompt.reply_to_continue).
            base = carried_on.content.rstrip(INCOMPLETE_CHARACTER)
            self.stream.base_text = self.stream.text = base
            self.stream.runs = fit_runs(list(carried_on.provenance), len(base))
        self.reply_started.emit(settings, verifier_label)
        self.refresh_state()

    def _stream_for(self, request_id: int) -> Stream | None:
        return self.stream if self.stream is not None and self.stream.request_id == request_id else None

    @Slot(int, object)
    def _on_prompt_prepared(self, request_id: int, event: PromptPrepared) -> None:
        stream = self._stream_for(request_id)
        if stream is not None and not event.dropped_turns:  # else the prompt lacks some of the characters
            stream.chars_per_token = chars_per_token(stream.prompt_chars, event.prompt_tokens)
        if stream is not None and event.dropped_turns:
            stream.note = f"the {event.dropped_turns} oldest messages were left out to fit the model's context"
            widget = self.pane.view.widget_for(stream.message_id)
            if widget is not None:
                widget.set_status(STREAMING, stream.note)

    @Slot(int, object, float)
    def _on_prompt_progress(self, request_id: int, event: PromptProgress, read_at: float) -> None:
        stream = self._stream_for(request_id)
        if stream is None:
            return
        if stream.reading_clock is None:
            stream.reading_clock = ReadingClock(self.reading_costs.get(stream.pair_name))
        clock = stream.reading_clock
        clock.add(event, read_at)
        seconds_left = clock.seconds_left()
        if clock.finished:
            self._remember_reading_cost(stream, clock)
        self.reading_progress.emit(event.fraction, seconds_left)
        widget = self.pane.view.widget_for(stream.message_id)
        if widget is not None:
            stream.reading = True
            widget.set_status(STREAMING, stream.note, activity=reading(event.fraction, seconds_left))

    def _remember_reading_cost(self, stream: Stream, clock: ReadingClock) -> None:
        known = self.reading_costs.get(stream.pair_name)
        ratio = stream.chars_per_token or (known.chars_per_token if known else None)
        measured = clock.cost()
        if measured is not None and ratio:
            self.reading_costs.remember(stream.pair_name, ReadingCost(*measured, ratio))

    @Slot(int, object)
    def _on_text_delta(self, request_id: int, delta: TextDelta) -> None:
        stream = self._stream_for(request_id)
        if stream is None:
            return
        if stream.reading:  # the first text: reading is over
            stream.reading = False
            widget = self.pane.view.widget_for(stream.message_id)
            if widget is not None:
                widget.set_status(STREAMING, stream.note)
        if not delta.text:
            return
        stream.text += delta.text
        extend_runs(stream.runs, split_delta(delta))
        now = time.monotonic()
        if now - stream.stored_at >= STORE_INTERVAL_S:
            stream.stored_at = now
            self.store.update_reply(stream.message_id, stream.text, stream.runs)
        widget = self.pane.view.widget_for(stream.message_id)
        if widget is not None:
            widget.set_content(stream.text, stream.runs)

    @Slot(int, object, object)
    def _on_finished(self, request_id: int, event: Finished, description: dict) -> None:
        stream = self._stream_for(request_id)
        if stream is None:
            return
        self.stream = None
        if stream.carried_on is not None and not event.token_ids:
            self._put_back(stream, stream.note)  # stopped before it wrote anything: as it was
            return
        # A continued reply is the reply so far and what this stream wrote; its figures are
        # those of this stream (the speed of the part just written).
        text = stream.base_text + event.text
        runs = fit_runs(stream.runs, len(text))
        figures = reply_figures(
            event.stats, stream.settings, stream.verifier_label, description, event.stop_reason, stream.quality
        )
        status = STOPPED if event.stop_reason == "stopped" else COMPLETE
        self.store.finish_reply(stream.message_id, text, runs, figures, status, stream.note)
        widget = self.pane.view.widget_for(stream.message_id)
        if widget is not None:
            widget.set_content(text, runs)
            widget.render()
            widget.set_status(status, stream.note)
            widget.set_figures(figures)
        self.refresh_state()

    @Slot(int, object)
    def _on_errored(self, request_id: int, error: Exception) -> None:
        stream = self._stream_for(request_id)
        message = error_text(error)
        self.pane.banner.show_message(message)
        if stream is None:
            return
        self.stream = None
        if stream.carried_on is not None:
            self._put_back(stream, message)  # the continue failed: the reply stays as it was
            return
        self.store.finish_reply(stream.message_id, stream.text, stream.runs, None, FAILED, message)
        widget = self.pane.view.widget_for(stream.message_id)
        if widget is not None:
            widget.render()
            widget.set_status(FAILED, message)
        self.refresh_state()

    def _put_back(self, stream: Stream, note: str) -> None:
        """A continue that wrote nothing, or failed: the reply as it was before it, with its
        figures (so Continue is offered again), its verifier and `note`."""
        before = stream.carried_on
        self.store.finish_reply(before.id, before.content, before.provenance, before.figures, before.status, note)
        self.store.set_verifier(before.id, before.verifier)
        widget = self.pane.view.widget_for(before.id)
        if widget is not None:
            widget.set_content(before.content, list(before.provenance))
            widget.render()
            widget.set_status(before.status, note)
            widget.show_verifier(before.verifier)
            if before.figures:
                widget.set_figures(before.figures)
        self.refresh_state()

    def save_for_close(self) -> None:
        """The app is closing mid-reply: keep what was shown, marked as stopped."""
        if self.stream is not None:
            stream, self.stream = self.stream, None
            self.store.finish_reply(
                stream.message_id, stream.text, stream.runs, None, STOPPED, "the app was closed during this reply"
            )

    @Slot()
    def refresh_state(self) -> None:
        client = self.client
        if client.pair is None and client.loading is not None:
            why_not = "The model pair is still loading."
        elif client.pair is None:
            why_not = "No model pair is loaded: choose one in Settings."
        elif client.loading is not None:
            why_not = "Another model pair is loading; sending resumes when it is ready."
        elif client.calibrating:
            why_not = "The pair's heads are being calibrated; sending resumes when that ends (Settings → Model pairs)."
        else:
            why_not = ""
        generating = self.stream is not None
        self.pane.set_state(client.can_generate and not generating, generating, why_not, loading=client.loading is not None)
        self.pane.view.update_actions(idle=client.can_generate and not generating)

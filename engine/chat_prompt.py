"""Turning a conversation into the prompt token ids a model continues.

The model's own chat template does the formatting. When the conversation is longer than the
context allows, the oldest turns are left out, whole, so the model still sees a conversation
that starts with a user message.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ContextOverflowError, PromptError

ROLES = ("system", "user", "assistant")
INCOMPLETE_CHARACTER = "\ufffd"  # what a decoder shows for the bytes of a character cut short


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user" or "assistant"
    content: str


@dataclass
class BuiltPrompt:
    token_ids: list[int]
    dropped_messages: int  # the oldest user/assistant messages left out to fit the context


def build_prompt(
    tokenizer: Any, messages: list[Message], system_prompt: str | None, max_prompt_tokens: int
) -> BuiltPrompt:
    """The prompt that asks the model to answer the last (user) message, or, when the
    conversation ends with an assistant message after it, to carry on that reply (Continue,
    for a reply that stopped at the token limit).

    System messages, `system_prompt` first, are always kept. When the whole conversation does
    not fit in `max_prompt_tokens`, the oldest user/assistant turns are dropped.
    """
    _check_messages(messages)
    pinned = [Message("system", system_prompt)] if system_prompt and system_prompt.strip() else []
    pinned += [message for message in messages if message.role == "system"]
    history = [message for message in messages if message.role != "system"]

    def tokens_from(start: int) -> list[int]:
        return encode_conversation(tokenizer, pinned + history[start:])

    everything = tokens_from(0)
    if len(everything) <= max_prompt_tokens:
        return BuiltPrompt(token_ids=everything, dropped_messages=0)

    # Each start keeps a suffix of the history that begins with a user message. Later starts
    # give shorter prompts, so the earliest start that fits is found by bisection.
    starts = [index for index, message in enumerate(history) if message.role == "user"]
    shortest = tokens_from(starts[-1])
    if len(shortest) > max_prompt_tokens and reply_to_continue(history) is not None:
        raise ContextOverflowError(
            f"This reply cannot be continued: with its question it is {len(shortest)} tokens long, and "
            f"only {max_prompt_tokens} fit in the model's context beside what it would write. "
            "Regenerate it instead, with a higher “Max new tokens”."
        )
    if len(shortest) > max_prompt_tokens:
        raise ContextOverflowError(
            f"The message is {len(shortest)} tokens long (with the system prompt and chat "
            f"formatting), but only {max_prompt_tokens} fit in the model's context. "
            "Shorten the message or the system prompt."
        )
    fits = bisect.bisect_left(starts, True, key=lambda start: len(tokens_from(start)) <= max_prompt_tokens)
    start = starts[fits]
    return BuiltPrompt(token_ids=tokens_from(start), dropped_messages=start)


def build_text_prompt(tokenizer: Any, text: str, max_prompt_tokens: int) -> BuiltPrompt:
    """The prompt that asks the model to continue `text` as it is, with no chat template."""
    if not text.strip():
        raise PromptError("The prompt is empty.")
    token_ids = list(tokenizer.encode(text))
    if len(token_ids) > max_prompt_tokens:
        raise ContextOverflowError(
            f"The prompt is {len(token_ids)} tokens long, but only {max_prompt_tokens} fit in the model's "
            "context beside what it would write. Shorten the prompt, or ask for fewer tokens."
        )
    return BuiltPrompt(token_ids=token_ids, dropped_messages=0)


def reply_to_continue(messages: Sequence[Message]) -> str | None:
    """The reply a conversation asks to carry on (its last non-system message is the
    assistant's), without the replacement characters of a character the token limit cut in
    two: the model writes that character again, whole. None for a question to answer."""
    talk = [message for message in messages if message.role != "system"]
    if talk and talk[-1].role == "assistant":
        return talk[-1].content.rstrip(INCOMPLETE_CHARACTER)
    return None


def encode_conversation(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Token ids of `messages` followed by the start of an assistant reply; when the last
    message is the assistant's, followed by that reply so far, for the model to carry on."""
    reply_so_far = reply_to_continue(messages)
    if reply_so_far is not None:
        last = max(index for index, message in enumerate(messages) if message.role != "system")
        asked = [message for index, message in enumerate(messages) if index != last]
        # The template would close the reply with an end-of-turn token; the text is appended
        # to the opened reply instead, as the model itself wrote it.
        return encode_conversation(tokenizer, asked) + list(tokenizer.encode(reply_so_far, add_special_tokens=False))
    if getattr(tokenizer, "chat_template", None):
        conversation = [{"role": message.role, "content": message.content} for message in messages]
        encoded = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
        return _plain_token_ids(encoded)
    # Base models have no template: a plain transcript is the best we can do for them.
    transcript = "".join(f"{message.role}: {message.content}\n" for message in messages) + "assistant:"
    return list(tokenizer.encode(transcript))


def _check_messages(messages: list[Message]) -> None:
    for message in messages:
        if message.role not in ROLES:
            raise PromptError(f"Unknown message role {message.role!r}; use one of {', '.join(ROLES)}.")
    talk = [message for message in messages if message.role != "system"]
    if talk and talk[-1].role == "assistant" and len(talk) >= 2 and talk[-2].role == "user":
        question = talk[-2]  # a reply to carry on: the question it answers must be there
    elif not messages or messages[-1].role != "user":
        raise PromptError("There is no user message to answer: the conversation must end with one.")
    else:
        question = messages[-1]
    if not question.content.strip():
        raise PromptError("The message is empty.")


def _plain_token_ids(encoded: Any) -> list[int]:
    """A flat list of ints from whatever `apply_chat_template` returned.

    transformers 5 returns a BatchEncoding (a dict with `input_ids`) by default; older
    versions returned a list, and some tokenizers return a batch of one.
    """
    if hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):
        (encoded,) = encoded
    return [int(token_id) for token_id in encoded]

"""A request's JSON read into a CompletionRequest, every value checked here so that a bad one
is a 400 naming the field, never an error from deep in a generation.

Fields OpenAI defines that change what a reply would be, and that Tandem does not do (`n` > 1,
`logprobs`, `tools`, penalties), are refused rather than ignored: a client must not believe it
got them. Fields that change nothing here (`user`, `metadata`) are ignored, as are unknown ones.

Tandem's own fields: `tandem_method` (a method of engine/methods.py; default `auto`, as in
the app) and `tandem_verifier` (`exact`, or `sprinter`: approximate, needs calibrated heads);
`top_k` as llama.cpp's server takes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import methods
from ..chat_prompt import Message
from ..config import CHAT_DEFAULT_TEMPERATURE, DecodeSettings
from .api_errors import RequestError

MAX_STOP_STRINGS = 4  # as OpenAI's API allows
MAX_SEED = 2**63 - 1  # what torch.Generator.manual_seed takes
# Roles a chat message may have; OpenAI's newer "developer" is a system message.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass(frozen=True)
class CompletionRequest:
    """One request to either endpoint: `messages` for a chat, `prompt` for a plain completion."""

    model: str | None
    messages: tuple[Message, ...] | None
    prompt: str | None
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the token counts
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    method: str | None  # None: the pair's default (auto)
    verifier: str  # methods.EXACT_MODE or methods.SPRINTER_MODE

    def decode_settings(self, pair: Any) -> DecodeSettings:
        """The settings of this request on `pair` (a LoadedPair), refused with a 400 where the
        pair cannot decode with the method asked for."""
        from ..session import method_refusal  # imports torch; the worker thread calls this

        method = methods.method_for_mode(self.method or methods.default_method(pair.methods), self.verifier)
        refusal = method_refusal(pair, method)
        if refusal:
            param = "tandem_verifier" if method == methods.SPRINTER_MODE else "tandem_method"
            raise RequestError(400, refusal, "method_unavailable", param)
        return DecodeSettings(
            method=method, max_new_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=self.top_k, seed=self.seed,
        )


def read_chat_request(body: dict, max_tokens_limit: int) -> CompletionRequest:
    """A POST /v1/chat/completions body."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages", "'messages' must be a non-empty list of {\"role\", \"content\"} objects")
    _refuse_unsupported(body, {"tools": [], "functions": [], "top_logprobs": 0})
    if body.get("response_format") not in (None, {"type": "text"}):
        raise _unsupported("response_format", "only {\"type\": \"text\"} is supported")
    return _read_common(body, max_tokens_limit, messages=tuple(_message(item, index) for index, item in enumerate(messages)))


def read_completion_request(body: dict, max_tokens_limit: int) -> CompletionRequest:
    """A POST /v1/completions body: `prompt` is one string (or a list of exactly one)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _invalid("prompt", "'prompt' must be a string (one prompt per request)")
    _refuse_unsupported(body, {"echo": False, "best_of": 1, "suffix": None})
    return _read_common(body, max_tokens_limit, prompt=prompt)


def _read_common(body: dict, max_tokens_limit: int, messages=None, prompt=None) -> CompletionRequest:
    _refuse_unsupported(body, {"n": 1, "logprobs": None, "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}})
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise _invalid("model", "'model' must be the name of a pair (GET /v1/models lists them)")
    # max_completion_tokens is the newer name of the same limit
    max_tokens = _integer(body, "max_tokens", None, 1, max_tokens_limit)
    if max_tokens is None:
        max_tokens = _integer(body, "max_completion_tokens", max_tokens_limit, 1, max_tokens_limit)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise _invalid("stream_options", "'stream_options' must be an object")
    method = body.get("tandem_method")
    if method is not None and method not in methods.NAMES:
        raise _invalid("tandem_method", f"'tandem_method' must be one of {', '.join(methods.NAMES)}")
    verifier = body.get("tandem_verifier", methods.EXACT_MODE)
    if verifier not in methods.VERIFIER_MODES:
        raise _invalid("tandem_verifier", f"'tandem_verifier' must be one of {', '.join(methods.VERIFIER_MODES)}")
    if verifier == methods.SPRINTER_MODE and method not in (None, methods.SPRINTER_MODE):
        raise _invalid("tandem_method", "'tandem_verifier': 'sprinter' decodes with SPRINTER's own rounds; leave out 'tandem_method'")
    if method == methods.SPRINTER_MODE:
        verifier = methods.SPRINTER_MODE
    return CompletionRequest(
        model=model,
        messages=messages,
        prompt=prompt,
        stream=_boolean(body, "stream", False),
        include_usage=_boolean(stream_options, "include_usage", False),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", CHAT_DEFAULT_TEMPERATURE, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=_integer(body, "top_k", 0, 0, None),
        seed=_integer(body, "seed", None, 0, MAX_SEED),
        stop=_stop_strings(body.get("stop")),
        method=method,
        verifier=verifier,
    )


def _message(item: Any, index: int) -> Message:
    param = f"messages[{index}]"
    if not isinstance(item, dict):
        raise _invalid(param, f"'{param}' must be an object with 'role' and 'content'")
    role = ROLES.get(item.get("role"))
    if role is None:
        raise _invalid(f"{param}.role", f"'{param}.role' must be one of {', '.join(ROLES)}")
    content = item.get("content")
    if isinstance(content, list):
        # Content parts: text is kept in order; anything else (images, audio) this server cannot read.
        if not all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content):
            raise _unsupported(f"{param}.content", f"'{param}.content' parts must all be text: the pair reads text only")
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise _invalid(f"{param}.content", f"'{param}.content' must be a string")
    return Message(role, content)


def _stop_strings(stop: Any) -> tuple[str, ...]:
    strings = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(strings, list) or not all(isinstance(s, str) and s for s in strings):
        raise _invalid("stop", "'stop' must be a non-empty string or a list of them")
    if len(strings) > MAX_STOP_STRINGS:
        raise _invalid("stop", f"'stop' may hold at most {MAX_STOP_STRINGS} strings")
    return tuple(strings)


def _refuse_unsupported(body: dict, neutral: dict[str, Any]) -> None:
    """Refuse a field Tandem does not do unless it holds its do-nothing value (or null)."""
    for name, value in neutral.items():
        given = body.get(name)
        if given is not None and given != value and not (given is False and value is None):
            raise _unsupported(name, f"'{name}' is not supported by this server (leave it out, or {value!r})")


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value > high or value < low or (low_open and value == low):
        bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise _invalid(name, f"'{name}' must be a number in {bounds}")
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int | None, high: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(name, f"'{name}' must be an integer")
    if low is not None and value < low:
        raise _invalid(name, f"'{name}' must be at least {low}")
    if high is not None and value > high:
        raise _invalid(name, f"'{name}' must be at most {high}, this server's limit")
    return value


def _boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _invalid(name, f"'{name}' must be true or false")
    return value


def _invalid(param: str, message: str) -> RequestError:
    return RequestError(400, message, "invalid_value", param)


def _unsupported(param: str, message: str) -> RequestError:
    return RequestError(400, message, "unsupported_parameter", param)

"""Request bodies read into CompletionRequests: OpenAI's defaults and names, Tandem's own
fields, and a 400 naming the field for every value that cannot be used."""
from __future__ import annotations

import pytest

from engine.config import CHAT_DEFAULT_TEMPERATURE
from engine.serve.api_errors import RequestError
from engine.serve.requests import read_chat_request, read_completion_request
from tests.engine.tiny_models import tiny_word_pair

LIMIT = 256
HELLO = [{"role": "user", "content": "Hello"}]


def refused(body: dict, read=read_chat_request) -> RequestError:
    with pytest.raises(RequestError) as error:
        read(body, LIMIT)
    assert error.value.status == 400
    return error.value


def test_a_bare_chat_request_gets_the_apps_defaults():
    request = read_chat_request({"messages": HELLO}, LIMIT)
    assert request.temperature == CHAT_DEFAULT_TEMPERATURE and request.top_p == 1.0 and request.top_k == 0
    assert request.max_tokens == LIMIT and request.seed is None and request.stop == ()
    assert request.method is None and request.verifier == "exact"
    assert not request.stream and request.model is None


def test_message_content_parts_and_the_developer_role_are_read():
    request = read_chat_request({"messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
    ]}, LIMIT)
    assert [(m.role, m.content) for m in request.messages] == [("system", "Be brief."), ("user", "Hello there")]
    image = {"type": "image_url", "image_url": {"url": "data:..."}}
    assert refused({"messages": [{"role": "user", "content": [image]}]}).param == "messages[0].content"


def test_openai_names_and_tandems_own_fields():
    request = read_chat_request({
        "messages": HELLO, "max_completion_tokens": 9, "stop": "\n", "seed": 3, "top_k": 40,
        "stream": True, "stream_options": {"include_usage": True}, "tandem_method": "sprinter", "user": "ignored",
    }, LIMIT)
    assert request.max_tokens == 9 and request.stop == ("\n",) and request.seed == 3 and request.top_k == 40
    assert request.stream and request.include_usage
    assert request.method == "sprinter" and request.verifier == "sprinter"  # the method implies its verifier


@pytest.mark.parametrize("changes, param", [
    ({"max_tokens": True}, "max_tokens"),  # a bool is not a number of tokens
    ({"max_tokens": LIMIT + 1}, "max_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"seed": -1}, "seed"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"model": ""}, "model"),
    ({"logprobs": True}, "logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tandem_verifier": "lenient"}, "tandem_verifier"),
    ({"tandem_verifier": "sprinter", "tandem_method": "chain"}, "tandem_method"),
])
def test_a_value_that_cannot_be_used_is_refused_by_name(changes, param):
    assert refused({"messages": HELLO, **changes}).param == param


def test_a_completion_takes_one_prompt():
    assert read_completion_request({"prompt": ["Once"]}, LIMIT).prompt == "Once"
    assert refused({"prompt": ["One", "Two"]}, read_completion_request).param == "prompt"
    assert refused({"prompt": "Once", "echo": True}, read_completion_request).param == "echo"


def test_the_settings_on_a_pair_default_to_auto_and_refuse_what_it_cannot_do(make_word_tokenizer):
    pair = tiny_word_pair(make_word_tokenizer)
    settings = read_chat_request({"messages": HELLO, "temperature": 0, "max_tokens": 5}, LIMIT).decode_settings(pair)
    assert settings.method == "auto" and settings.temperature == 0 and settings.max_new_tokens == 5
    error = refused_on(pair, {"messages": HELLO, "tandem_method": "staged"})
    assert error.param == "tandem_method" and "needs a draft model" in error.message


def refused_on(pair, body: dict) -> RequestError:
    with pytest.raises(RequestError) as error:
        read_chat_request(body, LIMIT).decode_settings(pair)
    return error.value

"""`tandem serve`'s routes, spoken to by the official `openai` client over loopback, on tiny
random pairs: replies equal the engine's own, whole or streamed, alone or under load; keys,
bad bodies, limits and too-long prompts are refused in OpenAI's error shape; a client that
goes away stops the engine."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import psutil
import pytest

from engine.chat_prompt import Message
from engine.config import DecodeSettings, ModelSpec, PairConfig
from engine.events import Finished
from engine.serve.limits import ServerLimits
from engine.serve.pair_host import PairHost
from tests.engine.serve.running_server import running_server
from tests.engine.tiny_models import WORDS, tiny_word_pair

KEY = "test-key"


@pytest.fixture
def tiny_pair(make_word_tokenizer):
    return tiny_word_pair(make_word_tokenizer)


@pytest.fixture
def server(tiny_pair):
    with running_server(PairHost(tiny_pair, saved_pairs=lambda: [])) as running:
        yield running


def client_of(url: str, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=60)


def engine_reply(pair, text: str, max_tokens: int) -> Finished:
    """What the engine alone writes for one user message, greedy, with the server's default method."""
    *_, finished = pair.generate([Message("user", text)], DecodeSettings(method="auto", max_new_tokens=max_tokens))
    return finished


def test_a_chat_completion_is_the_engines_reply_with_its_figures(server, tiny_pair):
    url, _api = server
    completion = client_of(url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "w5 w6 w7 w5 w6"}], max_tokens=12, temperature=0,
    )
    expected = engine_reply(tiny_pair, "w5 w6 w7 w5 w6", 12)
    assert completion.choices[0].message.content == expected.text
    assert completion.choices[0].finish_reason == "length"
    assert completion.model == "tiny" and completion.object == "chat.completion"
    assert completion.usage.completion_tokens == 12 and completion.usage.prompt_tokens == expected.stats.prompt_tokens
    timings = completion.model_extra["timings"]
    assert timings["predicted_n"] == 12 and timings["prompt_n"] == expected.stats.prompt_tokens
    assert timings["predicted_per_second"] > 0 and timings["approximate"] is False
    assert timings["target_calls"] >= 1 and timings["tokens_per_target_call"] == pytest.approx(12 / timings["target_calls"])
    assert timings["draft_n_accepted"] <= timings["draft_n"]
    assert sum(timings["rounds_by_method"].values()) == timings["target_calls"]


def test_a_streamed_chat_completion_adds_up_to_the_whole_reply(server, tiny_pair):
    url, _api = server
    stream = client_of(url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "w1 w2 w3"}], max_tokens=10, temperature=0,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == engine_reply(tiny_pair, "w1 w2 w3", 10).text
    assert len({chunk.id for chunk in chunks}) == 1
    last_choice = [chunk for chunk in chunks if chunk.choices][-1]
    assert last_choice.choices[0].finish_reason == "length"
    assert last_choice.model_extra["timings"]["predicted_n"] == 10
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_a_plain_completion_continues_the_text_without_the_chat_template(server, tiny_pair):
    url, _api = server
    completion = client_of(url).completions.create(model="tiny", prompt="w5 w6 w7", max_tokens=8, temperature=0)
    *_, expected = tiny_pair.complete("w5 w6 w7", DecodeSettings(method="auto", max_new_tokens=8))
    assert completion.choices[0].text == expected.text
    assert completion.usage.prompt_tokens == 3  # the words alone

    streamed = client_of(url).completions.create(model="tiny", prompt="w5 w6 w7", max_tokens=8, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed) == expected.text


def test_a_stop_string_ends_the_reply_before_it(server, tiny_pair):
    url, _api = server
    whole = engine_reply(tiny_pair, "w1 w2", 12).text
    stop = " " + " ".join(whole.split(" ")[5:7]) + " "  # two words: it arrives over two deltas, or three
    before = whole[:whole.index(stop)]
    assert before and len(before) < len(whole)
    for stream in (False, True):
        response = client_of(url).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "w1 w2"}], max_tokens=12, temperature=0, stop=[stop], stream=stream,
        )
        if stream:
            chunks = list(response)
            text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
            finish = chunks[-1].choices[0].finish_reason
        else:
            text, finish = response.choices[0].message.content, response.choices[0].finish_reason
        assert text == before
        assert finish == "stop"


def test_seeded_sampling_repeats_and_the_method_can_be_chosen(server):
    url, _api = server
    client = client_of(url)

    def ask(**options):
        return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w9 w8"}], max_tokens=10, **options)

    first = ask(temperature=0.9, top_p=0.9, seed=7)
    assert first.choices[0].message.content == ask(temperature=0.9, top_p=0.9, seed=7).choices[0].message.content
    plain = ask(temperature=0, extra_body={"tandem_method": "ar"})
    assert plain.model_extra["timings"]["method"] == "ar"
    assert plain.model_extra["timings"]["draft_n"] == 0 and plain.model_extra["timings"]["target_calls"] == 10


def test_models_lists_the_pairs_and_an_unknown_one_is_a_404(tiny_pair, make_word_tokenizer):
    other = tiny_word_pair(make_word_tokenizer)
    other.config = PairConfig("tiny-b", ModelSpec("tiny-b"))
    loads = []

    def load(config):
        loads.append(config.name)
        return other

    with running_server(PairHost(tiny_pair, saved_pairs=lambda: [other.config], load=load)) as (url, _api):
        client = client_of(url)
        listed = client.models.list().data
        assert [model.id for model in listed] == ["tiny", "tiny-b"]
        assert [model.model_extra["loaded"] for model in listed] == [True, False]
        with pytest.raises(openai.NotFoundError) as refused:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "w1"}], max_tokens=2)
        assert refused.value.code == "model_not_found" and "GET /v1/models" in refused.value.message
        switched = client.chat.completions.create(model="tiny-b", messages=[{"role": "user", "content": "w1"}], max_tokens=2)
        assert switched.model == "tiny-b" and loads == ["tiny-b"]
        assert httpx.get(f"{url}/health").json()["model"] == "tiny-b"


def test_a_wrong_or_missing_key_is_a_401_and_the_right_one_is_served(tiny_pair):
    with running_server(PairHost(tiny_pair, saved_pairs=lambda: []), api_key=KEY) as (url, _api):
        with pytest.raises(openai.AuthenticationError) as refused:
            client_of(url, "wrong-key").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w1"}])
        assert refused.value.code == "invalid_api_key"
        missing = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "w1"}]})
        assert missing.status_code == 401 and missing.json()["error"]["type"] == "authentication_error"
        assert [model.id for model in client_of(url, KEY).models.list().data] == ["tiny"]
        assert httpx.get(f"{url}/health").status_code == 200  # a liveness probe needs no key


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"messages": []}', "messages"),
    (b'{"messages": [{"role": "robot", "content": "w1"}]}', "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": "w1"}], "temperature": "hot"}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "w1"}], "max_tokens": 0}', "max_tokens"),
    (b'{"messages": [{"role": "user", "content": "w1"}], "n": 2}', "n"),
    (b'{"messages": [{"role": "user", "content": "w1"}], "tandem_method": "fastest"}', "tandem_method"),
    (b'{"messages": [{"role": "user", "content": "w1"}], "tandem_method": "tree"}', "tandem_method"),  # no draft model
    (b'{"messages": [{"role": "user", "content": "w1"}], "tandem_verifier": "sprinter"}', "tandem_verifier"),  # no heads
])
def test_a_malformed_body_or_a_bad_value_is_a_400_naming_the_field(server, body, param):
    url, _api = server
    response = httpx.post(f"{url}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_the_limits_on_body_size_and_max_tokens_are_refused_clearly(tiny_pair):
    limits = ServerLimits(max_body_bytes=2000, max_tokens=16)
    with running_server(PairHost(tiny_pair, saved_pairs=lambda: []), limits=limits) as (url, _api):
        client = client_of(url)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w1"}], max_tokens=17)
        assert refused.value.param == "max_tokens" and "at most 16" in refused.value.message
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w1 " * 1000}])
        assert refused.value.status_code == 413
        default = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w1"}], temperature=0)
        assert default.usage.completion_tokens == 16  # no max_tokens: the limit


def test_a_prompt_longer_than_the_context_is_a_400_streamed_or_not(server, tiny_pair):
    url, _api = server
    client = client_of(url)
    too_long = " ".join(WORDS[:50] * 2)  # 100 words; the context holds 96 tokens
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": too_long}], max_tokens=8, stream=stream)
        assert refused.value.code == "context_length_exceeded" and refused.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=too_long, max_tokens=8)
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "prompt"
    # A history the app would shorten by its oldest turns: an API client sent all of it to be read.
    history = []
    for turn in range(8):
        history += [{"role": "user", "content": " ".join(WORDS[turn:turn + 6])}, {"role": "assistant", "content": " ".join(WORDS[turn + 6:turn + 12])}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=[*history, {"role": "user", "content": "w1"}], max_tokens=8)
    assert refused.value.code == "context_length_exceeded"


class RecordedGeneration:
    """A generation whose events are kept, for a test to see what the engine did."""

    def __init__(self, generation):
        self.generation = generation
        self.events: list = []

    def stop(self) -> None:
        self.generation.stop()

    def __iter__(self):
        for event in self.generation:
            self.events.append(event)
            yield event


def slow_target(pair, seconds: float) -> list[RecordedGeneration]:
    """Every target call of `pair` takes `seconds` longer; returns the list its replies are recorded in."""
    forward_tree = pair.target_runner.forward_tree

    def slow_forward_tree(*args, **kwargs):
        time.sleep(seconds)
        return forward_tree(*args, **kwargs)

    pair.target_runner.forward_tree = slow_forward_tree
    recorded: list[RecordedGeneration] = []
    generate = pair.generate

    def recording_generate(*args, **kwargs):
        recorded.append(RecordedGeneration(generate(*args, **kwargs)))
        return recorded[-1]

    pair.generate = recording_generate
    return recorded


def wait_for(condition, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_client_that_leaves_mid_stream_stops_the_engine(server, tiny_pair):
    url, api = server
    recorded = slow_target(tiny_pair, 0.05)
    stream = client_of(url).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "w1 w2"}], max_tokens=80, temperature=0, stream=True,
        extra_body={"tandem_method": "ar"},
    )
    for _chunk, _ in zip(stream, range(3)):
        pass
    stream.close()
    wait_for(lambda: api.queue.cancelled == 1 and api.queue.running is None)
    (generation,) = recorded
    finished = generation.events[-1]
    assert isinstance(finished, Finished) and finished.stop_reason == "stopped"
    assert finished.stats.tokens_generated < 20  # of the 80 asked for: it stopped within a round or two
    assert api.queue.served == 0
    # The engine is free for the next request at once.
    reply = client_of(url).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w1"}], max_tokens=2)
    assert reply.usage.completion_tokens == 2


def test_a_request_whose_client_leaves_while_it_waits_never_runs(server, tiny_pair):
    url, api = server
    recorded = slow_target(tiny_pair, 0.05)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 30, "tandem_method": "ar"}
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=60)
        wait_for(lambda: api.queue.running is not None)
        with pytest.raises(httpx.ReadTimeout):  # waits behind the first, then gives up
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=0.3)
        assert first.result().status_code == 200
    wait_for(lambda: api.queue.cancelled == 1 and api.queue.waiting == 0)
    assert len(recorded) == 1 and api.queue.served == 1


def test_a_full_queue_is_a_503(tiny_pair):
    slow_target(tiny_pair, 0.05)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "w1 w2"}], "max_tokens": 20, "tandem_method": "ar"}
    with running_server(PairHost(tiny_pair, saved_pairs=lambda: []), limits=ServerLimits(max_waiting=1)) as (url, api):
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=60)
            wait_for(lambda: api.queue.running is not None)
            waiting = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=60)
            wait_for(lambda: api.queue.waiting == 1)
            refused = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_busy"
            assert running.result().status_code == 200 and waiting.result().status_code == 200


CLIENTS, REQUESTS = 20, 5


def test_greedy_replies_under_a_bounded_load_equal_each_alone_and_memory_settles(server):
    url, api = server
    prompts = [" ".join(WORDS[i:i + 4]) for i in range(0, 50, 5)]  # every client asks each in turn

    def ask(client: openai.OpenAI, prompt: str, stream: bool) -> tuple[str, dict]:
        response = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=0, stream=stream,
        )
        if not stream:
            return response.choices[0].message.content, response.model_extra["timings"]
        chunks = list(response)
        return "".join(chunk.choices[0].delta.content or "" for chunk in chunks), chunks[-1].model_extra["timings"]

    alone = {prompt: ask(client_of(url), prompt, stream=False)[0] for prompt in prompts}

    def one_client(index: int) -> list[tuple[str, str, dict]]:
        client = client_of(url)
        mine = [prompts[(index + turn) % len(prompts)] for turn in range(REQUESTS)]
        return [(prompt, *ask(client, prompt, stream=(index % 2 == 0))) for prompt in mine]

    def load() -> list[tuple[str, str, dict]]:
        with ThreadPoolExecutor(CLIENTS) as pool:
            return [result for client_results in pool.map(one_client, range(CLIENTS)) for result in client_results]

    process = psutil.Process()
    load()  # the first load grows what a load needs (threads' stacks, the allocator's arenas)
    before = process.memory_info().rss
    results = load()
    grown_mb = (process.memory_info().rss - before) / 2**20
    assert len(results) == CLIENTS * REQUESTS
    assert all(text == alone[prompt] for prompt, text, _ in results)  # every reply whole and the same as alone
    assert all(timings["predicted_n"] == 12 for _, _, timings in results)
    # Written one at a time, in turn: most waited, and the queue time is reported
    assert sorted(timings["queue_ms"] for _, _, timings in results)[len(results) // 2] > 0
    assert api.queue.served == len(prompts) + 2 * CLIENTS * REQUESTS and api.queue.failed == 0
    assert grown_mb < 25, f"the second load left {grown_mb:.0f} MB more resident"

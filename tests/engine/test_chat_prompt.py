from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from engine.chat_prompt import Message, build_prompt
from engine.errors import ContextOverflowError, PromptError

WORDS = ["system:", "user:", "assistant:", "system", "user", "assistant", "brief", "hi", "q1", "a1", "q2", "a2", "q3"]
# Every message costs 3 tokens plus one per word; the generation prompt costs 2.
TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant{% endif %}"
)
CONVERSATION = [
    Message("user", "q1"),
    Message("assistant", "a1"),
    Message("user", "q2"),
    Message("assistant", "a2"),
    Message("user", "q3"),
]


@pytest.fixture
def tokenizer(make_word_tokenizer):
    return make_word_tokenizer(WORDS, chat_template=TEMPLATE)


def text_of(tokenizer, token_ids: list[int]) -> str:
    return " ".join(tokenizer.convert_ids_to_tokens(token_ids))


def test_system_prompt_comes_first(tokenizer):
    prompt = build_prompt(tokenizer, [Message("user", "hi")], "brief", max_prompt_tokens=100)

    assert text_of(tokenizer, prompt.token_ids) == "<s> system brief </s> <s> user hi </s> <s> assistant"
    assert prompt.dropped_messages == 0
    assert all(type(token_id) is int for token_id in prompt.token_ids)


def test_blank_system_prompt_is_left_out(tokenizer):
    prompt = build_prompt(tokenizer, [Message("user", "hi")], "  ", max_prompt_tokens=100)

    assert text_of(tokenizer, prompt.token_ids) == "<s> user hi </s> <s> assistant"


def test_whole_conversation_when_it_fits(tokenizer):
    prompt = build_prompt(tokenizer, CONVERSATION, "brief", max_prompt_tokens=26)

    assert len(prompt.token_ids) == 26
    assert prompt.dropped_messages == 0


def test_oldest_turns_are_dropped_in_pairs(tokenizer):
    # Dropping only "q1" would fit 22 tokens, but would start the history with an answer.
    prompt = build_prompt(tokenizer, CONVERSATION, "brief", max_prompt_tokens=22)

    assert prompt.dropped_messages == 2
    assert text_of(tokenizer, prompt.token_ids) == (
        "<s> system brief </s> <s> user q2 </s> <s> assistant a2 </s> <s> user q3 </s> <s> assistant"
    )


def test_only_the_newest_message_is_kept_when_little_fits(tokenizer):
    prompt = build_prompt(tokenizer, CONVERSATION, "brief", max_prompt_tokens=10)

    assert prompt.dropped_messages == 4
    assert text_of(tokenizer, prompt.token_ids) == "<s> system brief </s> <s> user q3 </s> <s> assistant"


def test_a_message_that_cannot_fit_is_refused(tokenizer):
    with pytest.raises(ContextOverflowError, match="10 tokens long.*only 9 fit"):
        build_prompt(tokenizer, CONVERSATION, "brief", max_prompt_tokens=9)


@pytest.mark.parametrize(
    ("messages", "complaint"),
    [
        ([Message("user", "  \n")], "The message is empty."),
        ([], "no user message"),
        ([Message("assistant", "hi")], "no user message"),
        ([Message("user", "hi"), Message("assistant", "a1"), Message("assistant", "a2")], "no user message"),
        ([Message("user", " "), Message("assistant", "a1")], "The message is empty."),
        ([Message("robot", "hi")], "Unknown message role"),
    ],
)
def test_unusable_conversations_are_refused(tokenizer, messages, complaint):
    with pytest.raises(PromptError, match=complaint):
        build_prompt(tokenizer, messages, None, max_prompt_tokens=100)


def test_a_reply_to_carry_on_follows_the_opened_reply_without_its_end(tokenizer):
    """Continue: the reply so far is the start of the model's turn, not a closed message."""
    prompt = build_prompt(tokenizer, [*CONVERSATION, Message("assistant", "a1 a2")], "brief", max_prompt_tokens=100)

    assert text_of(tokenizer, prompt.token_ids).endswith("<s> user q3 </s> <s> assistant a1 a2")


def test_a_reply_to_carry_on_keeps_its_question_when_old_turns_are_dropped(tokenizer):
    prompt = build_prompt(tokenizer, [*CONVERSATION, Message("assistant", "a1")], "brief", max_prompt_tokens=12)

    assert prompt.dropped_messages == 4
    assert text_of(tokenizer, prompt.token_ids) == "<s> system brief </s> <s> user q3 </s> <s> assistant a1"


def test_tokenizer_without_template_gets_a_plain_transcript(make_word_tokenizer):
    tokenizer = make_word_tokenizer(WORDS)

    prompt = build_prompt(tokenizer, [Message("user", "hi")], "brief", max_prompt_tokens=100)

    assert text_of(tokenizer, prompt.token_ids) == "system: brief user: hi assistant:"


def test_demo_chat_template(demo_target_folder):
    tokenizer = AutoTokenizer.from_pretrained(demo_target_folder)

    prompt = build_prompt(tokenizer, [Message("user", "Hi!")], "Be brief.", max_prompt_tokens=100)

    assert tokenizer.decode(prompt.token_ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_character_cut_by_the_limit_is_left_for_the_model_to_write_again(tokenizer):
    prompt = build_prompt(tokenizer, [Message("user", "q1"), Message("assistant", "a1\ufffd\ufffd")], None, max_prompt_tokens=100)

    assert text_of(tokenizer, prompt.token_ids).endswith("<s> assistant a1")


def test_a_reply_too_long_to_continue_says_so_and_what_to_do(tokenizer):
    with pytest.raises(ContextOverflowError, match="cannot be continued.*Regenerate"):
        build_prompt(tokenizer, [Message("user", "q1"), Message("assistant", "a1 a2 a1 a2 a1 a2")], None, max_prompt_tokens=8)


def test_a_system_message_after_the_reply_still_continues_it(tokenizer):
    messages = [Message("user", "q1"), Message("assistant", "a1"), Message("system", "brief")]
    prompt = build_prompt(tokenizer, messages, None, max_prompt_tokens=100)

    assert text_of(tokenizer, prompt.token_ids) == "<s> system brief </s> <s> user q1 </s> <s> assistant a1"

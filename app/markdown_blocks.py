"""Split a (possibly half-streamed) markdown reply into prose and fenced code blocks, so
each code block can be shown with its own copy button.

Prose is split further at the paragraphs that start a new top-level one, so that while a
reply streams only its last paragraph is laid out again: shown as one block, every new word
re-laid the whole reply's text out, several times, on the window's thread."""
from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
LIST_ITEM = re.compile(r"^([-*+]|\d+[.)])(\s|$)")


@dataclass(frozen=True)
class Block:
    kind: str  # "prose" | "code"
    text: str
    language: str = ""
    closed: bool = True  # False for a code block whose closing fence has not streamed yet
    fence: str = ""  # a code block's opening fence: "```", "~~~~"


def split_blocks(markdown: str) -> list[Block]:
    blocks: list[Block] = []
    prose: list[str] = []
    code: list[str] = []
    fence = ""
    language = ""
    for line in markdown.split("\n"):
        if not fence:
            opening = FENCE.match(line)
            if opening:
                _flush_prose(blocks, prose)
                fence, language = opening.group(1), opening.group(2)
            else:
                if prose and not prose[-1].strip() and _starts_paragraph(line):
                    _flush_prose(blocks, prose)
                prose.append(line)
        elif line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            blocks.append(Block("code", "\n".join(code), language, fence=fence))
            code, fence = [], ""
        else:
            code.append(line)
    if fence:
        blocks.append(Block("code", "\n".join(code), language, closed=False, fence=fence))
    _flush_prose(blocks, prose)
    return blocks


def with_fences_closed(markdown: str) -> str:
    """`markdown` with its last code block closed where it was left open (a stopped reply), so
    that what follows it is not read as code."""
    blocks = split_blocks(markdown)
    if not blocks or blocks[-1].closed:
        return markdown
    return markdown.rstrip("\n") + "\n" + blocks[-1].fence


def _starts_paragraph(line: str) -> bool:
    """Whether `line`, after a blank line, starts a paragraph that markdown reads apart from
    what came before: not indented (a list item's continuation, indented code) and not a list
    item (a loose list's next item: apart, a numbered list would restart its numbers)."""
    return bool(line.strip()) and not line[0].isspace() and not LIST_ITEM.match(line)


def _flush_prose(blocks: list[Block], lines: list[str]) -> None:
    text = "\n".join(lines).strip("\n")
    if text.strip():
        blocks.append(Block("prose", text))
    lines.clear()


def with_line_breaks(prose: str) -> str:
    """Markdown joins the lines of a paragraph into one; a chat reply (a poem, an address)
    means its line breaks. Ends every line that continues a paragraph with a hard break
    (two spaces), except table rows, whose trailing spaces a table does not need."""
    lines = prose.split("\n")
    for index, line in enumerate(lines[:-1]):
        continues = line.strip() and lines[index + 1].strip()
        if continues and not line.lstrip().startswith("|") and not line.endswith("  "):
            lines[index] = line + "  "
    return "\n".join(lines)

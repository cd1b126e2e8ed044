"""Code blocks of the Markdown docs, and the shell commands in them, for tests that run a
doc's steps exactly as it prints them."""

from __future__ import annotations

import re
import textwrap

FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.MULTILINE | re.DOTALL)
HEREDOC = re.compile(r"<<-?\s*(?P<quote>['\"]?)(?P<word>\w+)(?P=quote)")


def section(text: str, heading: str) -> str:
    """The text under the heading that starts with `heading` (## or ###), up to the next
    heading of the same or a higher level."""
    match = re.search(rf"^(?P<level>#+) {re.escape(heading)}.*$", text, re.MULTILINE)
    assert match, f"no heading starting with {heading!r}"
    level = len(match.group("level"))
    lines: list[str] = []
    fenced = False
    for line in text[match.end():].splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            break  # the next heading (a `# comment` in a code block is none)
        lines.append(line)
    return "".join(lines)


def code_blocks(text: str, lang: str) -> list[str]:
    """The bodies of the fenced blocks of that language, unindented (list items indent them)."""
    return [textwrap.dedent(m.group("body")) for m in FENCE.finditer(text) if m.group("lang") == lang]


def shell_commands(block: str) -> list[str]:
    """The block's commands, one string each: a line, its `\\` continuations, a here-doc up to
    its end word, or a single-quoted string across lines. Comment lines are dropped."""
    commands: list[str] = []
    current: list[str] = []
    end_word: str | None = None
    for line in block.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        if end_word is not None:
            if line.strip() != end_word:
                continue
            end_word = None
        else:
            heredoc = HEREDOC.search(line)
            if heredoc:
                end_word = heredoc.group("word")
                continue
            text = "\n".join(current)
            if line.endswith("\\") or text.count("'") % 2 == 1:
                continue
        commands.append("\n".join(current))
        current = []
    assert not current, f"unfinished command in the block: {current}"
    return commands

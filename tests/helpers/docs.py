"""What the documentation tells a user to type: the shell lines of README.md's and docs/'s code blocks."""
import pathlib
import re
from typing import Iterator, List

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: First words of documented command lines that are not bpuemu's (shell built-ins and other tools).
NOT_OURS = {"cd", "export", "source", ".", "sudo", "python", "python3", "pip", "git", "docker", "kubectl",
            "systemctl", "ssh", "scp", "curl", "mkdir", "cat", "echo", "ls", "cp", "rm"}
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", flags=re.S | re.M)


def documentation_pages() -> List[pathlib.Path]:
    """README.md (the front page) and every page of the documentation site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_lines(markdown: str) -> Iterator[str]:
    """Each command line of the shell code blocks, continuation lines joined, without its comment-only lines."""
    for block in SHELL_BLOCK.findall(markdown):
        line = ""
        for raw in block.splitlines():
            text = raw.strip()
            if not line and (not text or text.startswith("#")):
                continue
            line += text[:-1] + " " if text.endswith("\\") else text
            if not text.endswith("\\"):
                yield line.removeprefix("$ ")
                line = ""


def readme_commands(markdown: str) -> set:
    """Command names a user types, from the shell code blocks of a page.

    A command is the first word of a command line (continuation lines joined),
    except paths (``scripts/demo.sh``), ``VAR=value`` assignments and other
    programs' names (NOT_OURS).
    """
    commands = set()
    for line in shell_lines(markdown):
        word = line.split()[0]
        if "/" in word or "=" in word or word in NOT_OURS:
            continue
        commands.add(word)
    return commands


def documented_commands() -> set:
    """The commands of every documentation page's shell blocks."""
    return set().union(*(readme_commands(p.read_text()) for p in documentation_pages()))

"""What the deploy tests read from deploy/: the Dockerfile's instructions, the systemd unit, ports.

The Dockerfile is parsed with dockerfile-parse (the same instruction model
Docker uses: one entry per instruction, continuation lines joined); the unit
file with the few systemd rules it relies on (``EnvironmentFile`` of
KEY=VALUE lines, ``${VAR}`` as one argument, ``$VAR`` split on whitespace).
"""
import json
import os
import pathlib
import shlex
import socket
from dataclasses import dataclass, field
from typing import Dict, List, Optional

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
HOST_DOCKERFILE = DEPLOY / "docker" / "host.Dockerfile"
COMPOSE = DEPLOY / "docker" / "docker-compose.yml"
K8S = DEPLOY / "k8s"
INSTALL_SH = DEPLOY / "board" / "install.sh"
UNIT = DEPLOY / "board" / "hrt_boardd.service"
ARM64_CHROOT = DEPLOY / "board" / "arm64_chroot.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Dockerfile ----------------------------------------------------------------

@dataclass
class Instruction:
    name: str  # upper case: FROM, RUN, USER, ...
    value: str
    line: int


@dataclass
class Stage:
    base: str
    alias: str
    instructions: List[Instruction] = field(default_factory=list)

    def all(self, name: str) -> List[Instruction]:
        return [i for i in self.instructions if i.name == name]

    def last(self, name: str) -> Optional[Instruction]:
        found = self.all(name)
        return found[-1] if found else None


def parse_dockerfile(path=DOCKERFILE) -> List[Stage]:
    """The build stages of a Dockerfile, in order (comments dropped)."""
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(path=os.fspath(path))
    stages: List[Stage] = []
    for item in parser.structure:
        name = item["instruction"].upper()
        if name == "COMMENT":
            continue
        ins = Instruction(name, item["value"], item["startline"] + 1)
        if name == "FROM":
            words = ins.value.split()
            words = [w for w in words if not w.startswith("--platform")]
            alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(words[0], alias))
        elif stages:
            stages[-1].instructions.append(ins)
    return stages


def exec_form(value: str, what: str) -> List[str]:
    """A JSON-array (exec form) instruction argument; shell form is refused."""
    try:
        argv = json.loads(value)
    except json.JSONDecodeError:
        raise AssertionError(f"{what} is in shell form ({value!r}): use the exec form [\"...\"] so signals reach "
                             f"the process") from None
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), f"{what}: {value!r}"
    return argv


@dataclass
class Healthcheck:
    options: Dict[str, str]
    argv: List[str]


def healthcheck(stage: Stage) -> Healthcheck:
    ins = stage.last("HEALTHCHECK")
    assert ins is not None, "no HEALTHCHECK in the final stage"
    head, sep, cmd = ins.value.partition("CMD")
    assert sep, f"HEALTHCHECK without CMD: {ins.value!r}"
    options = dict(opt.lstrip("-").split("=", 1) for opt in shlex.split(head))
    return Healthcheck(options, exec_form(cmd.strip(), "HEALTHCHECK CMD"))


def entry_command(stage: Stage) -> List[str]:
    """ENTRYPOINT + CMD, as `docker run IMAGE` runs them."""
    entry = stage.last("ENTRYPOINT")
    assert entry is not None, "no ENTRYPOINT in the final stage"
    cmd = stage.last("CMD")
    return exec_form(entry.value, "ENTRYPOINT") + (exec_form(cmd.value, "CMD") if cmd else [])


def flag_value(argv: List[str], flag: str) -> str:
    assert flag in argv, f"{flag} not in {argv}"
    return argv[argv.index(flag) + 1]


# --- systemd unit --------------------------------------------------------------

def parse_unit(text: str) -> Dict[str, Dict[str, List[str]]]:
    """section -> key -> values (a key may repeat), continuation lines joined."""
    sections: Dict[str, Dict[str, List[str]]] = {}
    current = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"unit line outside a section: {raw}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def parse_env_file(text: str) -> Dict[str, str]:
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not KEY=VALUE: {line!r}"
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def expand_exec(command: str, env: Dict[str, str]) -> List[str]:
    """systemd's ExecStart expansion for whole-word variables: ${VAR} -> one word, $VAR -> split words."""
    argv: List[str] = []
    for word in shlex.split(command):
        if word.startswith("${") and word.endswith("}"):
            argv.append(env.get(word[2:-1], ""))
        elif word.startswith("$") and word[1:].replace("_", "").isalnum():
            argv.extend(env.get(word[1:], "").split())
        else:
            assert "$" not in word, f"unsupported variable use in ExecStart word {word!r}"
            argv.append(word)
    return argv

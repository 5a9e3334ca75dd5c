"""What a unit runs: its ExecStart= command lines and environment, read over D-Bus.

`genready init` needs these whether or not the unit is running: `Manager.LoadUnit` loads a unit
that is not loaded yet, and the Service interface then carries ExecStart= (as systemd parsed it,
specifiers resolved, `$VAR` references not yet expanded) and Environment=. EnvironmentFile=
contents are not on the bus; they are read here from the files the unit names, when readable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from genready.store import bounded
from genready.systemd import bus, control
from genready.systemd.snapshot import exec_argvs


def _s(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class UnitExec:
    """The command lines and environment of one unit, as its manager holds them."""

    unit: str
    load_state: str
    active_state: str
    fragment_path: str
    commands: tuple[tuple[str, ...], ...]  # one argv per ExecStart= line
    environment: Mapping[str, str] = field(default_factory=dict)
    env_files: Mapping[str, str] = field(default_factory=dict)  # variable -> the EnvironmentFile= that set it
    notes: tuple[str, ...] = ()  # EnvironmentFile= that could not be read, and why


def parse_environment(entries: Iterable[str]) -> dict[str, str]:
    """KEY=VALUE strings (systemd's Environment= as the bus gives it) -> dict; later ones win."""
    env: dict[str, str] = {}
    for e in entries:
        k, eq, v = e.partition("=")
        if eq and k:
            env[k] = v
    return env


# systemd.service(5), "Command lines": `$$` is a `$`; `${VAR}` anywhere in a word is replaced by its value
# as it is; `$VAR` as a word of its own by its value split at whitespace (zero or more words).
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_WORD_VAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(argv: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], tuple[str, ...]]:
    """`argv` (ExecStart= words as the bus gives them) with `env`'s variables expanded as systemd expands
    them when it starts the command, and the variables it names that `env` does not set (systemd's own,
    such as $MAINPID or $CREDENTIALS_DIRECTORY, or ones from an EnvironmentFile= that could not be read).
    Those are left as written: what the words alone cannot say stays visible as such."""
    out: list[str] = []
    unknown: list[str] = []

    def value(name: str, written: str) -> str:
        if name in env:
            return env[name]
        if name not in unknown:
            unknown.append(name)
        return written

    for i, word in enumerate(argv):
        if i > 0 and (m := _WORD_VAR.fullmatch(word)):
            out.extend(value(m.group(1), word).split())
            continue
        out.append(_VAR.sub(lambda m: "$" if m.group(0) == "$$" else value(m.group(1), m.group(0)), word)
                   if i > 0 else word)
    return out, tuple(unknown)


MAX_ENV_FILE_BYTES = 1 << 20


def _env_file(path: str) -> tuple[dict[str, str], str]:
    """One EnvironmentFile=, in systemd's simple form (KEY=VALUE lines, # comments, quotes), and why it
    was not read ("" if it was, or is not there). Through the one bounded reader: a FIFO is not waited on."""
    env: dict[str, str] = {}
    try:
        text = bounded.read_file(path, MAX_ENV_FILE_BYTES).decode(errors="replace")
    except FileNotFoundError:
        return env, ""
    except bounded.FileError as e:
        return env, f"EnvironmentFile={e}; its variables are not known here"
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        k, _, v = line.partition("=")
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        env[k.strip().removeprefix("export ").strip()] = v
    return env, ""


def read(bus_kind: str, unit: str) -> UnitExec:
    """Load `unit` (it need not run) and read what it executes. Raises pystemd's errors."""
    with control.Client(bus_kind) as c:
        props = c.read_raw(unit)
    u = props[bus.UNIT_IFACE]
    load_state = _s(u.get(b"LoadState", b""))
    s = props[bus.SERVICE_IFACE] if load_state == "loaded" else {}
    env: dict[str, str] = {}
    # systemd applies EnvironmentFile= after Environment=: a variable set in both takes the file's value.
    env.update(parse_environment(_s(e) for e in s.get(b"Environment") or []))
    files: dict[str, str] = {}
    notes: list[str] = []
    for entry in s.get(b"EnvironmentFiles") or []:
        path = _s(entry[0])
        found, note = _env_file(path)
        env.update(found)
        files.update(dict.fromkeys(found, path))
        notes += [note] if note else []
    return UnitExec(unit=unit, load_state=load_state, active_state=_s(u.get(b"ActiveState", b"")),
                    fragment_path=_s(u.get(b"FragmentPath", b"")), commands=exec_argvs(s.get(b"ExecStart")),
                    environment=env, env_files=files, notes=tuple(notes))

"""The simulator's answer text, and arms that break it on purpose (issue 50 §5).

A healthy simulator answers every prompt with the same filler words (`FILLER`, in turn), token id
FIRST_TOKEN_ID + the word's place, whatever its speed or its speculative settings: a speculative
configuration's answers equal the baseline's, as speculative decoding promises. `--output-fault` breaks that:
- `diverge:N`: from token N on, other words (`OTHER`, in turn): what a drafter or tree verifier that emits
  wrong tokens answers (diverging early when N is small against the answer's length);
- `loop:N`: from token N on, one short phrase (`LOOP`) over and over: the answer fell into a repetition loop,
  which drafts well.
With --spec-accept or --spec-alpha the arm's acceptance looks as good as the flags say, so a sweep that reads
only speed and acceptance names it best. genready's output check (sweep/report/outputs.py) must mark it.
"""

from __future__ import annotations

import argparse
from typing import Final

FILLER: Final = ("the", "model", "is", "ready", "only", "when", "a", "real", "generation",
                 "served", "by", "its", "current", "process", "has", "succeeded")
# One word is one token. The ids are small on purpose so that no output id can be mistaken for a PID by a test
# that checks the PID never leaks.
FIRST_TOKEN_ID: Final = 10
OTHER: Final = ("none", "of", "these", "words", "were", "in", "the", "baseline", "answer", "so", "this", "arm",
                "emits", "wrong", "tokens", "fast")
LOOP: Final = ("and", "so", "on")
OTHER_ID: Final = 100
LOOP_ID: Final = 200
KINDS: Final = ("diverge", "loop")


def fault(s: str) -> tuple[str, int]:
    """`--output-fault KIND:N` as (KIND, N)."""
    kind, _, at = s.partition(":")
    if kind not in KINDS or not at.isdigit():
        raise argparse.ArgumentTypeError(f"must be diverge:N or loop:N (N: the token it starts at), not {s!r}")
    return kind, int(at)


def word(i: int, broken: tuple[str, int] | None) -> tuple[str, int]:
    """Token i of an answer (its text with the leading space, its id) under the arm `broken` (None: healthy)."""
    if broken is not None and i >= broken[1]:
        table, first = (OTHER, OTHER_ID) if broken[0] == "diverge" else (LOOP, LOOP_ID)
        k = (i - broken[1]) % len(table)
        return " " + table[k], first + k
    k = i % len(FILLER)
    return " " + FILLER[k], FIRST_TOKEN_ID + k

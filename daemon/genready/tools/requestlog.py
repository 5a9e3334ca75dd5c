"""The bench client's request lines, written as the requests finish: `{out}/requests.jsonl` (issue 50 §1).

One JSON object per request (its fields: tools/requestline.py), appended through store/durable: the file is
opened once, a line that a crash left unended is ended first, and lines go out in batches of FLUSH_BYTES, each
one synced write (durable.append), the last when the run ends. A run of 100,000 requests
holds at most one batch and the set of prompts already kept in memory, whatever its answers' lengths.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from genready.store import durable
from genready.tools import requestline as rl
from genready.tools import textloops
from genready.tools.benchfigures import Outcome
from genready.tools.benchline import Field
from genready.tools.prompts import Prompt

FLUSH_BYTES: Final = 1 << 20


def line_of(o: Outcome, pid: str, keep: bool) -> dict[str, object]:
    """The request line of one Outcome (with its answer's text) of prompt id `pid`; `keep`: its text and ids
    kept."""
    text, ids = o.answer, o.token_ids
    words: Sequence[object] = list(ids) if ids else textloops.words_of(text)
    steps = o.spec_verify_ct or (o.counts.steps if o.counts is not None else None)
    drafted = o.drafts.drafted if o.drafts else (o.counts.drafted if o.counts is not None else None)
    accepted = o.drafts.accepted if o.drafts else (o.counts.accepted if o.counts is not None else None)
    values: dict[Field, object] = {
        rl.PROMPT_ID: pid, rl.CATEGORY: o.category, rl.TURN: o.turn,
        rl.OK: o.ok, rl.ERROR: o.error[:rl.ERROR_CHARS], rl.SENT: round(o.sent, 6),
        rl.INPUT_TOKENS: o.input_tokens, rl.OUTPUT_TOKENS: o.tokens,
        rl.TTFT_MS: None if o.ttft is None else round(o.ttft * 1000, 3),
        rl.ITL_MEAN_MS: round(sum(o.itl) / len(o.itl) * 1000, 3) if o.itl else None,
        rl.E2E_MS: round(o.seconds * 1000, 3), rl.FINISH_REASON: o.finish_reason,
        rl.VERIFY_STEPS: steps, rl.DRAFTED: drafted, rl.DRAFT_ACCEPTED: accepted,
        rl.ACCEPT_LENGTH: round(o.tokens / steps, 4) if steps and o.tokens else None,
        rl.TEXT: rl.head(text) if keep and o.ok else None, rl.TEXT_CHARS: len(text),
        rl.TEXT_SHA256: rl.digest(text) if o.ok else None,
        rl.TOKEN_IDS: list(ids[:rl.MAX_TOKEN_IDS]) if keep and ids is not None else None,
        rl.TOKEN_COUNT: None if ids is None else len(ids),
        rl.TOKEN_IDS_SHA256: None if ids is None else rl.ids_digest(ids),
        rl.TAIL_LOOP: textloops.tail_loop(words) if o.ok else None,
        rl.UNIQUE_BIGRAMS: None if not o.ok or (u := textloops.unique_bigrams(words)) is None else round(u, 4),
    }
    return {f.key: v for f, v in values.items()}


class RequestLog:
    """Appends each request's line to `path`; call it with each Outcome, then close() once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = durable.open_append(path, read=True)
        self.regular = stat.S_ISREG(os.fstat(self.fd).st_mode)
        if self.regular:
            durable.end_line(self.fd)
        self.pending: list[bytes] = []
        self.size = 0
        self.kept: set[str] = set()  # prompt ids whose first answer's text is kept (at most MAX_KEPT_PROMPTS)
        self.lines = 0

    def __call__(self, o: Outcome, p: Prompt) -> None:
        pid = rl.prompt_id(p.text, p.messages, p.ids, o.turn)
        keep = o.ok and pid not in self.kept and len(self.kept) < rl.MAX_KEPT_PROMPTS
        if keep:
            self.kept.add(pid)
        # ASCII: an answer's lone surrogate (JSON lets a server send one) stays an escape, never invalid UTF-8
        raw = (json.dumps(line_of(o, pid, keep), allow_nan=False) + "\n").encode()
        self.pending.append(raw)
        self.size += len(raw)
        self.lines += 1
        if self.size >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """The pending lines in one write, synced (durable.append: a failed write is cut back, no torn line);
        a pipe's: written."""
        if self.pending:
            data = b"".join(self.pending)
            self.pending, self.size = [], 0
            (durable.append if self.regular else durable.write_all)(self.fd, data)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            os.close(self.fd)

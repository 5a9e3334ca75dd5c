"""The bench client's request lines: one JSON object per request, `{out}/requests.jsonl` (issue 50 §1).

Each `Field` is the one place a field of the line is named (as tools/benchline.py is for the result line): the
writer (tools/requestlog.py) keys its values by these fields, the sweep's output check (sweep/report/outputs.py)
reads them by `FIELD.key`. A request line says which prompt it answered (`prompt_id`: a digest of the prompt and
its turn, the same in every run of the same prompt), how it went (tokens, TTFT, mean ITL, end-to-end time, finish
reason, the answer's own acceptance figures) and what it generated: the text, bounded, with its full length and
a digest of the whole, the token ids where the server returns them, and two figures of degenerate output
(`tail_loop`, `unique_bigrams`: tools/textloops.py).

Bounded on a 100,000-request run: an answer's text (its first TEXT_BYTES) and token ids (the first
MAX_TOKEN_IDS) are kept only for the first answer of each of the first MAX_KEPT_PROMPTS prompts; every other
line keeps the digest and the length alone (at temperature 0 the same prompt gets the same answer, and the
output check compares digests first). docs/benchclient.md, "Request lines", gives the measured size and time.

A leaf: it imports nothing of genready but benchline's Field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Final

from genready.tools.benchline import Field

REQUESTS_FILE: Final = "requests.jsonl"  # beside the result line's file, unless --requests-output names another
TEXT_BYTES: Final = 8192  # of an answer's text kept, cut at a character's boundary
MAX_TOKEN_IDS: Final = 4096  # of an answer's token ids kept
MAX_KEPT_PROMPTS: Final = 2000  # prompts whose first answer's text and ids are kept; the rest: digests only
ERROR_CHARS: Final = 200  # of a failed request's reason

PROMPT_ID: Final = Field("prompt_id")  # sha256 of the prompt and its turn, 16 hex digits (prompt_id())
CATEGORY: Final = Field("category")
TURN: Final = Field("turn")  # 0: the first turn of its conversation
OK: Final = Field("ok")
ERROR: Final = Field("error")  # why it failed, bounded ("" when ok)
SENT: Final = Field("sent", unit="s")  # seconds after the run's start it was sent
INPUT_TOKENS: Final = Field("input_tokens", unit="tokens")  # the server's count, where its answer says
OUTPUT_TOKENS: Final = Field("output_tokens", unit="tokens")
TTFT_MS: Final = Field("ttft_ms", unit="ms")  # streaming only
ITL_MEAN_MS: Final = Field("itl_mean_ms", unit="ms")  # the mean gap between events with output, streaming only
E2E_MS: Final = Field("e2e_ms", unit="ms")
FINISH_REASON: Final = Field("finish_reason")  # "stop", "length", … as the server said
VERIFY_STEPS: Final = Field("verify_steps")  # the answer's verify steps (SGLang's spec_verify_ct, a kind's steps)
DRAFTED: Final = Field("drafted", unit="tokens")  # draft tokens proposed for this answer, where it says
DRAFT_ACCEPTED: Final = Field("draft_accepted", unit="tokens")
ACCEPT_LENGTH: Final = Field("accept_length", unit="tokens")  # output tokens / verify steps, where both are known
TEXT: Final = Field("text")  # the first TEXT_BYTES of the answer's text; None: not kept (see the module doc)
TEXT_CHARS: Final = Field("text_chars", unit="characters")  # the whole answer's length
TEXT_SHA256: Final = Field("text_sha256")  # of the whole answer's text (UTF-8)
TOKEN_IDS: Final = Field("token_ids")  # the first MAX_TOKEN_IDS output token ids; None: not returned or not kept
TOKEN_COUNT: Final = Field("token_count", unit="tokens")  # how many ids the server returned
TOKEN_IDS_SHA256: Final = Field("token_ids_sha256")  # of all of them (their JSON)
TAIL_LOOP: Final = Field("tail_loop", unit="words")  # the period of a loop covering the answer's tail, or None
UNIQUE_BIGRAMS: Final = Field("unique_bigrams")  # distinct word bigrams over all bigrams (None under 2 words)

FIELDS: Final = tuple(v for v in dict(globals()).values() if isinstance(v, Field))
BY_KEY: Final = {f.key: f for f in FIELDS}


def prompt_id(text: str, messages: Sequence[tuple[str, str]], ids: Sequence[int], turn: int) -> str:
    """The stable id of a prompt's turn: the same prompt (its text, chat messages or token ids) and turn give the
    same id in every run, on every host (a digest, not Python's salted hash)."""
    doc = json.dumps([text, [list(m) for m in messages], list(ids), turn], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def head(text: str, limit: int = TEXT_BYTES) -> str:
    """The first `limit` bytes of `text`'s UTF-8, cut back to a character's boundary."""
    raw = text.encode()
    return text if len(raw) <= limit else raw[:limit].decode(errors="ignore")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()


def ids_digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(ids), separators=(",", ":")).encode()).hexdigest()

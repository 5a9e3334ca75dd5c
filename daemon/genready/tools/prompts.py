"""What the bench client sends: the built-in prompts, a dataset file, or random token ids.

Speculative decoding's accept length depends on the text being generated, so one fixed
sentence measures little. The default is a small built-in set written for genready (chat,
code, reasoning, summarising, extraction, translation: short and long). `--dataset FILE` reads
JSON Lines with `prompt` (text) or `messages` (chat) per line, or a ShareGPT-style JSON array
(`conversations` with `from`/`value`); the first turn of each conversation is used.
`--random-input-len` sends random token ids (no tokenizer needed), as SGLang's and vLLM's
benchmark scripts do for their "random" datasets.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

# Token ids for random prompts: inside every modern vocabulary (32k and up) and clear of the low
# ids tokenizers reserve for special tokens.
RANDOM_ID_RANGE: Final = (1000, 30000)


class DatasetError(Exception):
    """A dataset file that cannot be used; the message starts with FILE:LINE (exit 65)."""


@dataclass(frozen=True)
class Prompt:
    """One request's input: text, a chat's first turn, or token ids; and its own output length, if any."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()  # (role, content), for the chat API
    ids: tuple[int, ...] = ()
    max_tokens: int | None = None

    def as_text(self) -> str:
        """For a text API: the text, or the chat turn's contents one after another."""
        return self.text or "\n\n".join(c for _, c in self.messages)

    def as_messages(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages] or [{"role": "user", "content": self.text}]


_SYSTEM_CODE = "You are a careful senior software engineer. Answer with code first, then one short paragraph."
_SYSTEM_TERSE = "You are a concise assistant. Answer in as few words as the question allows."

BUILTIN: Final[tuple[Prompt, ...]] = (
    Prompt("Explain to a new colleague what a systemd drop-in file is and when to use one instead of editing "
           "the unit file."),
    Prompt("Write a Python function that merges overlapping intervals given as a list of (start, end) tuples, "
           "with type hints and a docstring."),
    Prompt("A train leaves at 09:40 and arrives at 13:05, with a 25-minute stop on the way. How long was it "
           "moving? Show your reasoning step by step."),
    Prompt("Summarise in three bullet points: Speculative decoding lets a small draft model propose several "
           "tokens that a large target model then verifies in one forward pass. Accepted tokens cost one large "
           "pass for several tokens; a rejected draft costs the draft's time. The speed-up therefore depends on "
           "how often the drafts are right, which in turn depends on the text being written."),
    Prompt(messages=(("system", _SYSTEM_CODE), ("user", "Write a bash script that waits until a TCP port on "
                                                "localhost accepts connections, giving up after 60 seconds."))),
    Prompt("Translate into French and then into German: 'The server is ready only when a real generation "
           "has succeeded.'"),
    Prompt("List the planets of the solar system in order from the sun, with one fact about each."),
    Prompt("Write a haiku about a GPU waiting for its model weights to load."),
    Prompt("What is the difference between a process and a thread? Answer for someone who knows no "
           "operating-system terms."),
    Prompt("Write a SQL query that returns, for each customer, their three most recent orders, given tables "
           "customers(id, name) and orders(id, customer_id, placed_at, total)."),
    Prompt("If all bloops are razzies and all razzies are lazzies, are all bloops definitely lazzies? Explain."),
    Prompt("Draft a polite two-paragraph e-mail asking a colleague to review a pull request by Friday."),
    Prompt(messages=(("system", _SYSTEM_TERSE), ("user", "What is the capital of Australia?"))),
    Prompt("Explain the CAP theorem with one concrete example for each pair of properties."),
    Prompt("Write a Rust function that parses a line like 'key=value' into a (String, String) pair and "
           "returns an error for a line without '='."),
    Prompt("Count from 1 to 40, writing each number as an English word, separated by commas."),
    Prompt("Extract every date from this text as ISO 8601: 'We met on March 3rd, 2021, again on 4 July 2022, "
           "and the contract ends 2025-01-31.'"),
    Prompt("Describe how a hash map handles collisions, comparing chaining with open addressing."),
    Prompt("Write a short story of about 150 words about a lighthouse keeper who receives a letter from the "
           "future."),
    Prompt("Solve for x and explain each step: 3(x - 4) + 2 = 5x - 10."),
    Prompt(messages=(("system", _SYSTEM_CODE), ("user", "Write a JavaScript debounce function and show how to "
                                                "use it on a search box's input event."))),
    Prompt("Summarise the plot of Romeo and Juliet in exactly five sentences."),
    Prompt("What are the trade-offs between TCP and UDP for a real-time multiplayer game?"),
    Prompt("Convert this JSON into YAML: {\"name\": \"sim\", \"ports\": [30000, 30001], \"tls\": {\"verify\": "
           "true, \"ca\": \"/etc/ssl/ca.pem\"}}"),
    Prompt("Give five tips for writing clear commit messages, each with a short good and bad example."),
    Prompt("A bag has 3 red and 5 blue marbles. Two are drawn without replacement. What is the probability "
           "that both are blue? Reason it out."),
    Prompt("Write a unit test in pytest for a function is_palindrome(s) that ignores case and punctuation."),
    Prompt("Explain what a p99 latency is, and why an average latency can hide a problem."),
    Prompt(messages=(("system", _SYSTEM_TERSE), ("user", "Name three sorting algorithms that run in "
                                                 "O(n log n) in the worst case."))),
    Prompt("Rewrite this sentence in plain English: 'Pursuant to the aforementioned stipulations, the party "
           "of the first part shall remit payment forthwith.'"),
    Prompt("Write the Go code for an HTTP handler that returns the server's uptime as JSON."),
    Prompt("Compare renting and buying a home in a short table with five rows of criteria."),
)


# ShareGPT's own dump is ~650 MB: the cap is for a FIFO's or a device's endless stream, not a real dataset.
MAX_DATASET_BYTES: Final = 1 << 30


def load_dataset(path: Path) -> list[Prompt]:
    """Prompts from a JSON Lines or ShareGPT-style JSON file; DatasetError naming FILE:LINE otherwise.
    Read through the one bounded reader (config.read_file): a FIFO or a device is refused, not read."""
    from genready import config

    try:
        raw = config.read_file(path, MAX_DATASET_BYTES)
    except config.FileError as e:
        raise DatasetError(f"{e.path}: cannot use it as the dataset: {e.problem}") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the dataset: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DatasetError(f"{path}:{line}: not UTF-8 text") from None
    if not text.strip():
        raise DatasetError(f"{path}:1: the dataset is empty (expected JSON Lines with \"prompt\" or \"messages\", "
                           "or a ShareGPT JSON array)")
    entries = _json_array(path, text) if text.lstrip().startswith("[") else _json_lines(path, text)
    prompts = [p for line, doc in entries if (p := _prompt(path, line, doc)) is not None]
    if not prompts:
        raise DatasetError(f"{path}:1: no usable prompt in {len(entries)} entries")
    return prompts


def _json_lines(path: Path, text: str) -> list[tuple[int, Any]]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except ValueError as e:
            raise DatasetError(f"{path}:{n}: not a JSON object ({e})") from None
        except RecursionError:
            raise DatasetError(f"{path}:{n}: JSON nested too deeply to read") from None
    return out


def _json_array(path: Path, text: str) -> list[tuple[int, Any]]:
    """The elements of a JSON array, each with the line it starts on (for error messages)."""
    dec = json.JSONDecoder()
    out: list[tuple[int, Any]] = []
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i < len(text) and text[i] == "]":
            return out
        line = text.count("\n", 0, i) + 1
        if i >= len(text):
            raise DatasetError(f"{path}:{line}: the JSON array is not closed")
        try:
            doc, i = dec.raw_decode(text, i)
        except ValueError as e:
            raise DatasetError(f"{path}:{line}: not valid JSON ({e})") from None
        except RecursionError:
            raise DatasetError(f"{path}:{line}: JSON nested too deeply to read") from None
        out.append((line, doc))


_ROLES: Final = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                 "system": "system"}


def _prompt(path: Path, line: int, doc: Any) -> Prompt | None:
    """The first turn of one entry: its user message (after any system message). None: no user turn."""
    where = f"{path}:{line}"
    if not isinstance(doc, dict):
        raise DatasetError(f"{where}: expected a JSON object, found {type(doc).__name__}")
    if "prompt" in doc:
        if not isinstance(doc["prompt"], str) or not doc["prompt"].strip():
            raise DatasetError(f"{where}: \"prompt\": expected non-empty text, found {doc['prompt']!r:.40}")
        return Prompt(doc["prompt"])
    if "messages" in doc:
        turns = [(m.get("role"), m.get("content")) for m in doc["messages"] if isinstance(m, dict)] \
            if isinstance(doc["messages"], list) else []
    elif "conversations" in doc:
        turns = [(_ROLES.get(str(m.get("from"))), m.get("value")) for m in doc["conversations"]
                 if isinstance(m, dict)] if isinstance(doc["conversations"], list) else []
    else:
        raise DatasetError(f"{where}: expected \"prompt\", \"messages\" or \"conversations\", found keys "
                           f"{', '.join(sorted(doc)) or 'none'}")
    first: list[tuple[str, str]] = []
    for role, content in turns:
        if not isinstance(role, str) or not isinstance(content, str):
            raise DatasetError(f"{where}: a turn without role/from and content/value text")
        first.append((role, content))
        if role == "user":
            return Prompt(messages=tuple(first))
    return None  # a conversation that starts with the assistant: nothing to ask


def random_prompt(rng: random.Random, input_len: int | None, output_len: int | None, ratio: float) -> Prompt:
    """Random token ids of a length in [max(1, N*ratio), N] (as SGLang's bench_serving draws them),
    and an output length drawn the same way."""
    def length(n: int) -> int:
        return rng.randint(max(1, int(n * ratio)), n)
    ids = tuple(rng.randrange(*RANDOM_ID_RANGE) for _ in range(length(input_len))) if input_len else ()
    return Prompt(ids=ids, max_tokens=length(output_len) if output_len else None)


def schedule(prompts: Sequence[Prompt], n: int, rng: random.Random) -> list[Prompt]:
    """`n` prompts: the set shuffled (by `rng`, so --seed repeats it), and again when it runs out."""
    out: list[Prompt] = []
    while len(out) < n:
        order = list(prompts)
        rng.shuffle(order)
        out += order
    return out[:n]

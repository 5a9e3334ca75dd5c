"""What the bench client sends: the built-in prompts, a dataset file, or random token ids.

Speculative decoding's accept length depends on the text being generated, so one fixed
sentence measures little. The default is a built-in set written for genready, eight prompts in each of six
categories (writing, coding, mathematical reasoning, summarization, translation, extraction), each asking
for a long answer; `--prompts classic` is the earlier set of 32 uncategorised ones. Figures are given per
category (a dataset entry's `category`). `--dataset FILE` reads
JSON Lines with `prompt` (text) or `messages` (chat) per line, Spec-Bench's and MT-bench's question.jsonl
(`question_id`, `category`, `turns`: FastChat's fastchat/llm_judge/data/mt_bench/question.jsonl, Spec-Bench's
data/spec_bench/question.jsonl), or a ShareGPT-style JSON array (`conversations` with `from`/`value`, of which
the first user turn is sent). A question's later `turns` are sent one after another, each with the earlier turns
and the server's own answers to them (Prompt.turn; the run is benchrun's).
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
    category: str = ""  # the kind of prompt ("coding", "writing", ...): figures are given per category
    later_turns: tuple[str, ...] = ()  # a multi-turn question's later user turns (MT-bench, Spec-Bench)

    def as_text(self) -> str:
        """For a text API: the text, or the chat turn's contents one after another."""
        return self.text or "\n\n".join(c for _, c in self.messages)

    def as_messages(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.messages] or [{"role": "user", "content": self.text}]

    def turns(self) -> int:
        """How many requests this prompt is: 1, or a multi-turn question's turns."""
        return 1 + len(self.later_turns)

    def turn(self, answers: Sequence[str]) -> Prompt:
        """The request of turn len(answers) (0: the first): the earlier turns, each followed by the server's own
        answer to it (`answers`, verbatim), then this turn's user text, as chat messages; a text API sends their
        contents one after another (as_text). As FastChat's MT-bench answers are made (fastchat/llm_judge/
        gen_api_answer.py: conv.append_message(user, turn), the answer of /v1/chat/completions'
        choices[0].message.content put back with conv.update_last_message) and Spec-Bench's (evaluation/eval.py:
        conv.messages[-1][-1] = output)."""
        if not answers:
            return self
        if len(answers) > len(self.later_turns):
            raise ValueError(f"turn {len(answers) + 1} of a {self.turns()}-turn prompt")
        first = self.messages or (("user", self.text),)
        history = [*first]
        for answer, user in zip(answers, self.later_turns[:len(answers)], strict=True):
            history += [("assistant", answer), ("user", user)]
        return Prompt(messages=tuple(history), max_tokens=self.max_tokens, category=self.category)


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


# The default set (--prompts categories): six kinds of prompt, eight each, written for genready (copied from no
# dataset). Spec-Bench and MT-bench report acceptance per category because drafts of code and arithmetic are
# accepted far more often than drafts of free prose; each prompt asks for a long answer (at least 128 tokens).
_LONG: Final = " Write at least 200 words."
_SOURCE_TEXT: Final = (
    "The readiness daemon watches each inference server that systemd starts. When the server's main process "
    "changes, every earlier result is forgotten, because a new process has not yet shown that it can generate. "
    "The daemon then sends a short real generation request and waits for tokens to come back. Only when the "
    "answer arrives from the current process does it tell systemd that the unit is ready. If the model takes "
    "six minutes to load, the unit stays in its starting state for six minutes, and anything ordered after it "
    "waits. Operators liked this because dashboards stopped showing green while a model was still loading, and "
    "load balancers stopped sending traffic to a port that accepted connections but could not yet answer.")
_TEXTS: Final = {
    "writing": (
        "Write a short story about a night-shift engineer who discovers that the cluster's oldest GPU has been "
        "quietly finishing everyone else's jobs.",
        "Write a persuasive blog post arguing that small teams should write their own runbooks before buying "
        "monitoring tools.",
        "Write a letter from a lighthouse keeper to the engineer who will replace the lamp with an automatic one.",
        "Write the opening chapter of a mystery novel set in a data centre during a week-long heat wave.",
        "Write a speech for the retirement party of a colleague who maintained the company's build system for "
        "twenty years.",
        "Write a travel essay about a slow train journey through mountain villages in late autumn.",
        "Write a product announcement for a fictional kettle that tells you, politely, when the water is ready.",
        "Write a dialogue between two programmers arguing about tabs and spaces, in which both slowly change "
        "their minds.",
    ),
    "coding": (
        "Write a Python module that implements an LRU cache class with get, put and a capacity limit, with type "
        "hints, docstrings and a few pytest tests.",
        "Write a C function that reverses a singly linked list in place, the struct definition, and a main "
        "function that builds, reverses and prints a list of ten nodes.",
        "Write a Go program that reads lines from standard input, counts how often each word occurs, and prints "
        "the twenty most frequent words with their counts.",
        "Write a TypeScript class for a rate limiter using the token bucket algorithm, with a method that says "
        "whether a request may go now, and example usage.",
        "Write a Rust function that parses a simple INI file into a map of sections to key-value maps, returning "
        "an error with the line number for malformed lines, and unit tests.",
        "Write a bash script that rotates log files in a directory: compress files older than a day, delete "
        "compressed files older than a week, and print what it did.",
        "Write a Python asyncio program that fetches ten URLs concurrently with at most three requests in flight, "
        "retrying each failed request twice with exponential backoff.",
        "Write a SQL schema for a library (books, members, loans) and five queries: overdue loans, most borrowed "
        "books, members with no loans, loans per month, and books never borrowed.",
    ),
    "math_reasoning": (
        "A tank holds 1200 litres. One pipe fills it in 40 minutes and another drains it in 60 minutes. Starting "
        "empty with both open, how long until it is full? Solve step by step and check the answer.",
        "Prove that the sum of the first n odd numbers is n squared, first by induction and then with a picture "
        "argument described in words.",
        "A shop raises a price by 20 percent and later lowers it by 20 percent. Is the final price higher or "
        "lower than the original, and by how much? Work through it with an example and then in general.",
        "Solve the system 2x + 3y - z = 5, x - y + 2z = 3, 3x + y + z = 10 step by step, and verify the solution.",
        "Three dice are rolled. What is the probability that the sum is exactly 10? Count the cases carefully "
        "and explain the method.",
        "A car travels 150 km at 60 km/h and returns at 90 km/h. What is its average speed for the whole trip? "
        "Explain why it is not 75 km/h.",
        "Find all integer solutions of x squared minus y squared equals 45, showing each step of the reasoning.",
        "A savings account pays 4 percent a year, compounded monthly. Starting with 5000, how much is there "
        "after 3 years? Show each step and compare with yearly compounding.",
    ),
    "summarization": tuple(f"{ask}\n\n{_SOURCE_TEXT}" for ask in (
        "Summarise the following text in a paragraph, then list its three main claims.",
        "Summarise the following text for a manager who has no technical background.",
        "Summarise the following text as release notes, with a headline and bullet points.",
        "Summarise the following text, then say what questions an operator might still have.",
        "Write a summary of the following text for a newsletter, and suggest a title.",
        "Summarise the following text in the form of a short FAQ with four questions and answers.",
        "Summarise the following text and then explain the problem it solves in your own words.",
        "Summarise the following text for an engineer who will run the daemon for the first time.",
    )),
    "translation": tuple(f"{ask}\n\n{_SOURCE_TEXT}" for ask in (
        "Translate the following text into French.",
        "Translate the following text into German.",
        "Translate the following text into Spanish.",
        "Translate the following text into Italian.",
        "Translate the following text into Portuguese.",
        "Translate the following text into Dutch.",
        "Translate the following text into Polish.",
        "Translate the following text into Swedish.",
    )),
    "extraction": tuple(f"{ask}\n\n{_SOURCE_TEXT}" for ask in (
        "From the following text, extract every actor (person, program or system) and what each one does, as a "
        "table, then explain each row.",
        "From the following text, extract every event in the order it happens, as a numbered list with a "
        "sentence on each.",
        "From the following text, answer these questions and quote the sentence that supports each answer: "
        "What resets the daemon's results? What does it send? When does it notify systemd? Who benefited?",
        "From the following text, extract all durations and conditions as JSON with keys and values, then "
        "explain each key.",
        "From the following text, list every claim about operators and say for each whether the text gives "
        "evidence for it.",
        "From the following text, extract the technical terms and define each one in two sentences.",
        "From the following text, extract the cause and effect pairs, one per line, and explain each link.",
        "From the following text, answer: why does the unit stay starting for six minutes, and what would go "
        "wrong without this design? Support each point with the text.",
    )),
}
CATEGORIZED: Final[tuple[Prompt, ...]] = tuple(Prompt(text + _LONG, category=cat)
                                               for cat, texts in _TEXTS.items() for text in texts)
# --prompts: the built-in sets by name; the first is the default (without --prompt, --dataset or random ids).
PROMPT_SETS: Final[dict[str, tuple[Prompt, ...]]] = {"categories": CATEGORIZED, "classic": BUILTIN}


# ShareGPT's own dump is ~650 MB: the cap is for a FIFO's or a device's endless stream, not a real dataset.
MAX_DATASET_BYTES: Final = 1 << 30
# A category is a label in a table, not text: longer ones are a mistaken field.
MAX_CATEGORY: Final = 64


def load_dataset(path: Path) -> list[Prompt]:
    """Prompts from a JSON Lines or ShareGPT-style JSON file; DatasetError naming FILE:LINE otherwise.
    Read through the one bounded reader (bounded.read_file): a FIFO or a device is refused, not read."""
    from genready.store import bounded

    try:
        raw = bounded.read_file(path, MAX_DATASET_BYTES)
    except bounded.FileError as e:
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
    category = doc.get("category", "")
    if not isinstance(category, str) or len(category) > MAX_CATEGORY:
        raise DatasetError(f"{where}: \"category\": expected text of at most {MAX_CATEGORY} characters, "
                           f"found {category!r:.40}")
    if "prompt" in doc:
        if not isinstance(doc["prompt"], str) or not doc["prompt"].strip():
            raise DatasetError(f"{where}: \"prompt\": expected non-empty text, found {doc['prompt']!r:.40}")
        return Prompt(doc["prompt"], category=category)
    if "turns" in doc:  # Spec-Bench's and MT-bench's question.jsonl: {"question_id", "category", "turns": [...]}
        turns = doc["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise DatasetError(f"{where}: \"turns\": expected a non-empty list of non-empty texts, "
                               f"found {turns!r:.40}")
        return Prompt(turns[0], category=category, later_turns=tuple(turns[1:]))
    if "messages" in doc:
        turns = [(m.get("role"), m.get("content")) for m in doc["messages"] if isinstance(m, dict)] \
            if isinstance(doc["messages"], list) else []
    elif "conversations" in doc:
        turns = [(_ROLES.get(str(m.get("from"))), m.get("value")) for m in doc["conversations"]
                 if isinstance(m, dict)] if isinstance(doc["conversations"], list) else []
    else:
        raise DatasetError(f"{where}: expected \"prompt\", \"messages\" or \"conversations\" (or MT-bench's "
                           "\"turns\"), found keys "
                           f"{', '.join(sorted(doc)) or 'none'}")
    first: list[tuple[str, str]] = []
    for role, content in turns:
        if not isinstance(role, str) or not isinstance(content, str):
            raise DatasetError(f"{where}: a turn without role/from and content/value text")
        first.append((role, content))
        if role == "user":
            return Prompt(messages=tuple(first), category=category)
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

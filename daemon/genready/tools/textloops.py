"""Degenerate output, per answer: does it end in a loop, and how varied are its word pairs (issue 50 §3).

An answer that falls into a repetition loop is easy to draft, so a looping configuration reports a high accept
length (one public report: 7.76 on the looping arm against 2.68 on the healthy one). Two figures, on words (the
text split on whitespace; token ids where the server returned them):
- `tail_loop(words)`: the shortest period p (1 to MAX_PERIOD) such that the answer's last half (at least
  MIN_TAIL words) repeats itself at distance p on at least LOOP_SHARE of its positions; None when none does. A
  period repeated fewer than MIN_REPEATS times is no loop (a list of two items is not one);
- `unique_bigrams(words)`: distinct adjacent pairs over all pairs (1.0: no pair repeats; a loop of period p over
  n words tends to p / n).
Each comparison of a period runs in C (operator.eq over two slices), so an answer of 8,000 words costs well
under a millisecond per period. Pure functions.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Final

MAX_PERIOD: Final = 64  # words: a longer cycle is a repeated paragraph, which the bigram ratio still shows
MIN_TAIL: Final = 24  # words: a shorter answer has no tail to judge
MIN_REPEATS: Final = 3  # the period's unit must recur this often within the tail
LOOP_SHARE: Final = 0.9  # of the tail's positions that equal the word p before them
MAX_WORDS: Final = 16_384  # words judged: the last ones (a loop is at the end)
PROBE: Final = 16  # the last words compared first, per period (below MIN_TAIL - MAX_PERIOD would not matter)


def words_of(text: str) -> list[str]:
    return text.split()[-MAX_WORDS:]


def tail_loop(words: Sequence[object]) -> int | None:
    """The period of a loop that covers the last half of `words` (module doc), or None."""
    words = words[-MAX_WORDS:]
    n = len(words)
    tail = max(MIN_TAIL, n // 2)
    if n < MIN_TAIL:
        return None
    seq = list(words[n - tail:])
    end = seq[-PROBE:]
    for p in range(1, min(MAX_PERIOD, tail // MIN_REPEATS) + 1):
        # a loop at the tail repeats at its very end: a period whose last PROBE positions mostly differ is none
        # (most periods of most answers end here, at a tenth of the whole comparison's cost)
        if sum(map(operator.eq, end, seq[-PROBE - p:-p])) < LOOP_SHARE * PROBE - 1:
            continue
        same = sum(map(operator.eq, seq[p:], seq[:-p]))
        if same >= LOOP_SHARE * (tail - p):
            return p
    return None


def unique_bigrams(words: Sequence[object]) -> float | None:
    """Distinct adjacent pairs over all adjacent pairs of `words`; None under 2 words."""
    words = words[-MAX_WORDS:]
    if len(words) < 2:
        return None
    pairs = list(itertools.pairwise(words))
    return len(set(pairs)) / len(pairs)

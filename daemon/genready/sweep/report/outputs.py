"""Same prompts, same tokens: each point's answers against its baseline round's, prompt by prompt (issue 50 §2-3).

Speculative decoding is meant to be lossless: at temperature 0 a speculative configuration should produce the
baseline's tokens, only faster. A sweep that reads only speed names a configuration that emits wrong tokens, or
falls into loops that draft well, its best. With a `baseline` in the plan and temperature 0, each ok point's
request lines ({out}/requests.jsonl, tools/requestline.py) are paired with its baseline round's (the round
speedup.attach pairs it with) by prompt id, and `attach` gives each row an OutputCheck:
- `match`: the share of the prompts both answered whose output equals the baseline's (the token ids' digest where
  both sides have ids, else the text's);
- the matching prefix before the first divergence, as a share of the longer answer (ids where both kept them,
  else characters of the kept text): its median and 10th percentile. Floating-point sums differ between batch
  shapes, so a healthy server's greedy answer may leave the baseline's late (docs/sweeps.md, "Same prompts, same
  tokens"); a broken verifier leaves it early;
- `early`: the share of prompts that diverge before EARLY of their length; above the plan's `max_divergence`
  the point is marked `diverged`;
- degenerate output: answers that end in a loop (`tail_loop`) or whose unique-bigram ratio falls under
  BIGRAM_DROP of the baseline answer's, where the baseline's answer to the same prompt does not: on more than
  DEGENERATE_SHARE of the prompts the point is marked `degenerate`. Without a baseline (or at temperature > 0)
  a loop is still a loop, with a lower claim: a point whose answers loop on more than ALONE_SHARE more of them
  than the least looping point's is marked.
A marked point holds no best value and is never named best (rows.mark_best, report/decision.py).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from genready.redact import escape
from genready.store import bounded
from genready.sweep.files import bench_line, warn_line
from genready.sweep.report import slower
from genready.sweep.rows import OutputCheck, Row
from genready.tools import benchline
from genready.tools import requestline as rl
from genready.web import htmlpage

EARLY: Final = 0.5  # a divergence before this share of the answer is early
BIGRAM_DROP: Final = 0.5  # an answer whose unique-bigram ratio is under this share of the baseline answer's
DEGENERATE_SHARE: Final = 0.05  # of the compared prompts, newly looping or collapsed: marked degenerate
ALONE_SHARE: Final = 0.25  # without a baseline: looping on this many more answers than the least looping point
MAX_REQUEST_BYTES: Final = 256 << 20  # a requests.jsonl: 100,000 lines are about 60 MB (docs/benchclient.md)
SHOWN_CHARS: Final = 2000  # of a diverging answer shown in a report
BASELINE_ITSELF: Final = "the baseline itself"
MAX_TIMES: Final = 64  # end-to-end times kept per prompt: their median is the prompt's


@dataclass(frozen=True)
class Answer:
    """One prompt's answer, from its request lines: its first ok one, the kept text and ids from any."""

    text_sha: str
    chars: int
    ids_sha: str | None
    count: int | None
    text: str | None
    ids: list[int] | None
    loop: bool
    bigrams: float | None
    category: str = ""
    tokens: int = 0  # output tokens of the first ok answer
    e2e_ms: list[float] = field(default_factory=list)  # every ok answer's end-to-end time (slower.py)


def read_answers(folders: Sequence[Path]) -> dict[str, Answer] | None:
    """Each prompt's answer over the runs' request lines, in order; None when no folder has request lines."""
    found = False
    out: dict[str, Answer] = {}
    for folder in folders:
        path = folder / rl.REQUESTS_FILE
        try:
            data = bounded.read_file(path, MAX_REQUEST_BYTES)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except bounded.FileError as e:
            warn_line(f"{e}; its answers are not compared")
            continue
        found = True
        for raw in data.split(b"\n"):
            try:
                rec = json.loads(raw) if raw.strip() else None
            except ValueError:
                rec = None
            if isinstance(rec, dict) and rec.get(rl.OK.key) is True:
                _add(out, rec)
    return out if found else None


def _add(out: dict[str, Answer], rec: dict[str, Any]) -> None:
    pid, sha = rec.get(rl.PROMPT_ID.key), rec.get(rl.TEXT_SHA256.key)
    if not isinstance(pid, str) or not isinstance(sha, str):
        return
    text, ids = rec.get(rl.TEXT.key), rec.get(rl.TOKEN_IDS.key)
    text = text if isinstance(text, str) else None
    ids = ids if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None
    e2e = rec.get(rl.E2E_MS.key)
    have = out.get(pid)
    if have is not None:  # a later answer lends its time, and the kept text or ids of the same output
        if isinstance(e2e, int | float) and len(have.e2e_ms) < MAX_TIMES:
            have.e2e_ms.append(float(e2e))
        if have.text is None and text is not None and have.text_sha == sha:
            out[pid] = Answer(**{**have.__dict__, "text": text, "ids": ids if have.ids is None else have.ids})
        return
    ids_sha, count, chars = rec.get(rl.TOKEN_IDS_SHA256.key), rec.get(rl.TOKEN_COUNT.key), rec.get(rl.TEXT_CHARS.key)
    bigrams, cat, tokens = rec.get(rl.UNIQUE_BIGRAMS.key), rec.get(rl.CATEGORY.key), rec.get(rl.OUTPUT_TOKENS.key)
    out[pid] = Answer(sha, chars if isinstance(chars, int) else 0, ids_sha if isinstance(ids_sha, str) else None,
                      count if isinstance(count, int) else None, text, ids, rec.get(rl.TAIL_LOOP.key) is not None,
                      float(bigrams) if isinstance(bigrams, int | float) else None,
                      cat if isinstance(cat, str) else "", tokens if isinstance(tokens, int) else 0,
                      [float(e2e)] if isinstance(e2e, int | float) else [])


def _common(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def compare(a: Answer, base: Answer) -> tuple[bool, float | None]:
    """(equal, the matching prefix's share of the longer answer; None when neither side kept what shows it)."""
    if a.ids_sha is not None and base.ids_sha is not None:
        if a.ids_sha == base.ids_sha:
            return True, 1.0
        if a.ids is not None and base.ids is not None:
            return False, _common(a.ids, base.ids) / max(a.count or len(a.ids), base.count or len(base.ids), 1)
    elif a.text_sha == base.text_sha:
        return True, 1.0
    if a.text is not None and base.text is not None:
        if a.text_sha == base.text_sha:
            return True, 1.0
        return False, _common(a.text, base.text) / max(a.chars, base.chars, 1)
    return False, None


def _collapsed(a: Answer, base: Answer) -> bool:
    """`a` degenerated where the baseline's answer to the same prompt did not."""
    if a.loop and not base.loop:
        return True
    return a.bigrams is not None and base.bigrams is not None and a.bigrams < BIGRAM_DROP * base.bigrams


def check(answers: dict[str, Answer], base: dict[str, Answer], limit: float) -> OutputCheck:
    """A point's answers against its baseline round's (module doc)."""
    shared = [pid for pid in base if pid in answers]
    if not shared:
        return OutputCheck(False, "no prompt answered by both it and its baseline round (the bench client sends the "
                                  "same prompts only with the same --seed)")
    matched, prefixes, early, first = 0, list[float](), 0, None
    for pid in shared:
        equal, prefix = compare(answers[pid], base[pid])
        matched += equal
        if prefix is not None:
            prefixes.append(prefix)
        if not equal and (prefix is None or prefix < EARLY):
            early += 1
            if first is None:
                first = (pid, (answers[pid].text or "")[:SHOWN_CHARS], (base[pid].text or "")[:SHOWN_CHARS])
    collapsed = sum(_collapsed(answers[pid], base[pid]) for pid in shared)
    loops = sum(a.loop for a in answers.values())
    n = len(shared)
    prefixes.sort()
    diverged, degenerate = early / n > limit, collapsed > DEGENERATE_SHARE * n
    claim = "; ".join(([f"{early} of {n} answers leave the baseline's before half their length (max_divergence "
                        f"{limit:g})"] if diverged else []) +
                      ([f"{collapsed} of {n} answers loop or repeat where the baseline's do not: its acceptance is "
                        "inflated by easy drafts"] if degenerate else []))
    return OutputCheck(True, compared=n, match=matched / n, slower=slower.of({
        pid: slower.Pair(base[pid].category, answers[pid].tokens, base[pid].tokens, answers[pid].e2e_ms,
                         base[pid].e2e_ms) for pid in shared}),
                       prefix_median=statistics.median(prefixes) if prefixes else None,
                       prefix_p10=prefixes[int(0.1 * (len(prefixes) - 1))] if prefixes else None,
                       early=early / n, diverged=diverged, loops=loops, new_loops=collapsed, degenerate=degenerate,
                       claim=claim, first=first if diverged else None)


def _temperature(folders: Sequence[Path]) -> float | None:
    """The highest temperature the runs' bench lines name (None: none names one)."""
    got = []
    for folder in folders:
        try:
            line = bench_line(folder)
        except bounded.FileError:
            continue
        t = (line or {}).get(benchline.TEMPERATURE.key)
        if isinstance(t, int | float) and not isinstance(t, bool):
            got.append(float(t))
    return max(got) if got else None


def attach(rows: Sequence[Row]) -> None:
    """Each ok row's OutputCheck (module doc): against the baseline round speedup.attach pairs it with."""
    with_baseline = any(r.baseline for r in rows)
    answers = {id(r): read_answers(r.outs) for r in rows if r.status == "ok"}
    bases = {json.dumps([r.host, r.baseline, r.client], sort_keys=True): r
             for r in rows if r.baseline and r.status == "ok" and r.client is not None}
    alone: list[tuple[Row, float]] = []  # rows not compared, with request lines: their share of looping answers
    for r in rows:
        mine = answers.get(id(r))
        if r.status != "ok":
            continue
        if mine is None:
            r.outputs = OutputCheck(False, "no request lines (results from before them, or --no-requests-output)")
            continue
        why = ""
        temp = _temperature(r.outs)
        base = bases.get(json.dumps([r.host, r.baseline_round, r.client], sort_keys=True)) \
            if r.baseline_round and r.client is not None else None
        theirs = answers.get(id(base)) if base is not None else None
        if r.baseline:
            why = BASELINE_ITSELF
        elif not with_baseline:
            why = "no baseline in the plan"
        elif temp is None or temp > 0:
            why = f"temperature {temp:g} > 0: sampled answers differ by design" if temp else \
                "no temperature in its bench line"
        elif base is None or theirs is None:
            why = "its baseline round has no request lines" if base is not None else "no baseline round before it"
        if why:
            r.outputs = OutputCheck(False, why, loops=sum(a.loop for a in mine.values()))
            if mine:
                alone.append((r, r.outputs.loops / len(mine)))
            continue
        assert theirs is not None
        r.outputs = check(mine, theirs, r.max_divergence)
    floor = min((share for _, share in alone), default=0.0)
    for r, share in alone:
        if share > ALONE_SHARE and share - floor > ALONE_SHARE and r.outputs is not None:
            r.outputs = OutputCheck(False, r.outputs.why, loops=r.outputs.loops, degenerate=True,
                                    claim=f"{share:.0%} of its answers end in a loop against {floor:.0%} for the "
                                    "least looping point (no baseline answer to compare: a lower claim)")


def with_outputs(rows: Sequence[Row]) -> bool:
    """Whether a table has an OUTPUT column: some point's answers were compared with the baseline's, or marked."""
    return any(r.outputs is not None and (r.outputs.ran or r.outputs.marked) for r in rows)


def cell(r: Row) -> str:
    """The table's OUTPUT cell: the match and the prefix's p10, and the marks; `-` where the check did not run."""
    c = r.outputs
    if c is None:
        return ""
    shown = marks(c).upper().replace(" AND ", " ")
    if not c.ran:
        return shown or "-"
    p10 = "-" if c.prefix_p10 is None else f"{c.prefix_p10:.2f}"
    return f"{c.match or 0:.0%} p10 {p10}" + (f" {shown}" if shown else "")


def marks(c: OutputCheck) -> str:
    return " and ".join(m for m, on in (("diverged", c.diverged), ("degenerate", c.degenerate)) if on)


def as_json(c: OutputCheck | None) -> dict[str, Any] | None:
    if c is None:
        return None
    return {"ran": c.ran, "why_not": c.why or None, "compared": c.compared, "output_match": c.match,
            "prefix_median": c.prefix_median, "prefix_p10": c.prefix_p10, "early_divergence": c.early,
            "diverged": c.diverged, "loops": c.loops, "degenerate_answers": c.new_loops, "degenerate": c.degenerate,
            "claim": c.claim or None, "slower": slower.as_json(c.slower)}


def notes(rows: Sequence[Row]) -> list[str]:
    """The words under a table or a Decision: each marked point, and why the check did not run where it did not."""
    out = [f"{escape(r.label)} is marked {marks(c)} and never named best: {c.claim}"
           for r in rows if (c := r.outputs) is not None and c.marked]
    whys = sorted({c.why for r in rows if (c := r.outputs) is not None and not c.ran and c.why != BASELINE_ITSELF})
    if whys:
        out.append("outputs not compared with the baseline's: " + "; ".join(whys))
    return out


def html_section(rows: Sequence[Row]) -> str:
    """The page's "Same prompts, same tokens" section: per marked point its claim and its first early-diverging
    prompt's answer beside the baseline's (escaped, the first SHOWN_CHARS of each); "" when no point is marked."""
    e = htmlpage.text
    marked = [(r, c) for r in rows if (c := r.outputs) is not None and c.marked]
    if not marked:
        return ""
    out = ['<h2 id="outputs">Same prompts, same tokens</h2>']
    for r, c in marked:
        out.append(f"<h3>{e(r.label)}: {e(marks(c))}</h3><p>{e(c.claim)}</p>")
        if c.first is not None:
            pid, mine, base = c.first
            out.append(f"<p>first diverging prompt {e(pid)}</p><table><thead><tr><th>its answer</th>"
                       f"<th>the baseline's</th></tr></thead><tbody><tr><td><pre>{e(mine) or '(not kept)'}</pre></td>"
                       f"<td><pre>{e(base) or '(not kept)'}</pre></td></tr></tbody></table>")
    return "\n".join(out)

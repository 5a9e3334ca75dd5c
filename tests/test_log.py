"""genready.log: journal priority prefixes, plain lines elsewhere, key=value events, summarized repeats."""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path

import pytest

from genready import log


class FakeClock:
    """Seconds that only move when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def journal_stream_of(f: io.IOBase) -> str:
    st = os.fstat(f.fileno())
    return f"{st.st_dev}:{st.st_ino}"


def emit_all_levels() -> None:
    logger = logging.getLogger(log.LOGGER_NAME)
    logger.debug("d")
    logger.info("i")
    logger.warning("w")
    logger.error("e")
    logger.critical("c")


def test_journal_prefixes_when_stderr_is_the_journal_stream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with (tmp_path / "journal").open("w+") as f:
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream_of(f))
        log.setup("debug", stream=f)
        emit_all_levels()
        f.flush()
        f.seek(0)
        assert f.read().splitlines() == ["<7>d", "<6>i", "<4>w", "<3>e", "<2>c"]


def test_inherited_journal_stream_for_another_stream_means_plain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell spawned by a service inherits JOURNAL_STREAM while its stderr is a terminal."""
    with (tmp_path / "journal").open("w") as j, (tmp_path / "tty").open("w+") as f:
        monkeypatch.setenv("JOURNAL_STREAM", journal_stream_of(j))
        log.setup("info", stream=f)
        logging.getLogger(log.LOGGER_NAME).info("hello")
        f.flush()
        f.seek(0)
        assert not f.read().startswith("<")


def test_journal_forced_on_and_level_filtering() -> None:
    buf = io.StringIO()
    log.setup("warning", journal=True, stream=buf)
    emit_all_levels()
    assert buf.getvalue().splitlines() == ["<4>w", "<3>e", "<2>c"]


def test_every_traceback_line_keeps_the_priority() -> None:
    buf = io.StringIO()
    log.setup("info", journal=True, stream=buf)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger(log.LOGGER_NAME).exception("sglang: crashed")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "<3>sglang: crashed"
    assert len(lines) > 2 and all(line.startswith("<3>") for line in lines)


def test_plain_format_without_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    buf = io.StringIO()
    log.setup("info", stream=buf)
    logger = logging.getLogger(log.LOGGER_NAME)
    log.event(logger, logging.WARNING, "sglang: probe failed", result="refused")
    logger.debug("not shown at info")
    (line,) = buf.getvalue().splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}"
    assert re.fullmatch(stamp + " WARNING sglang: probe failed result=refused", line), line


def test_setup_defaults_to_stderr_and_replaces_its_handler(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    log.setup("info")
    log.setup("info")  # again: still one line per record
    logging.getLogger(log.LOGGER_NAME).info("once")
    err = capsys.readouterr().err
    assert err.count("once") == 1 and err.rstrip().endswith("INFO once")


def test_setup_rejects_unknown_level() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        log.setup("verbose")


@pytest.mark.parametrize(("value", "text"), [
    (4242, "4242"),
    ("ab12cd34", "ab12cd34"),
    (362.1, "362.1"),
    (362.10000000000002, "362.1"),
    (0.0, "0"),
    (0.0001234, "0.000123"),
    (True, "true"),
    (None, "-"),
    ("connection refused", '"connection refused"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("a=b", '"a=b"'),
    ("", '""'),
    ("line1\nline2", '"line1\\nline2"'),
])
def test_format_value(value: object, text: str) -> None:
    assert log.format_value(value) == text


def test_event_is_one_line_human_words_first() -> None:
    buf = io.StringIO()
    log.setup("info", journal=True, stream=buf)
    log.event(logging.getLogger(log.LOGGER_NAME), logging.INFO, "sglang: ready",
              pid=4242, invocation="ab12cd34", load_seconds=362.1, detail="100% of\nweights")
    assert buf.getvalue() == (
        '<6>sglang: ready pid=4242 invocation=ab12cd34 load_seconds=362.1 detail="100% of\\nweights"\n'
    )


def summarizer(interval: float = 60.0) -> tuple[log.Summarizer, FakeClock, io.StringIO]:
    buf = io.StringIO()
    log.setup("debug", journal=True, stream=buf)
    clock = FakeClock()
    return log.Summarizer(logging.getLogger(log.LOGGER_NAME), interval=interval, clock=clock), clock, buf


def summary_count(line: str) -> int:
    m = re.search(r"×(\d+) in the last \d+ s", line)
    assert m, line
    return int(m.group(1))


def test_six_minute_load_writes_a_handful_of_lines() -> None:
    s, clock, buf = summarizer()
    logged = 0
    for i in range(180):  # a probe every 2 s for 6 min, all refused
        clock.now = 1000.0 + 2 * i
        logged += s.note("sglang", "refused", "sglang: not answering yet", result="refused", attempt=i + 1)
    clock.now += 2
    assert s.flush("sglang")  # the server answered
    lines = buf.getvalue().splitlines()
    assert logged + 1 == len(lines) <= 10
    assert lines[0] == "<4>sglang: not answering yet result=refused attempt=1"
    summaries = lines[1:]
    assert all(line.startswith("<4>sglang: refused ×") for line in summaries)
    assert 1 + sum(summary_count(line) for line in summaries) == 180
    # The summary carries the latest occurrence's fields.
    assert summaries[-1].endswith("attempt=180")
    assert not s.flush("sglang")  # nothing pending any more


def test_periodic_summary_names_the_window() -> None:
    s, clock, buf = summarizer(interval=60.0)
    assert s.note("sglang", "refused", "first")
    for t in range(2, 62, 2):
        clock.now = 1000.0 + t
        s.note("sglang", "refused", "again")
    assert buf.getvalue().splitlines() == ["<4>first", "<4>sglang: refused ×30 in the last 60 s"]
    assert s.pending("sglang") == 0


def test_change_of_failure_class_summarizes_the_old_then_logs_the_new() -> None:
    s, clock, buf = summarizer()
    assert s.note("sglang", "refused", "sglang: refused")
    for _ in range(5):
        clock.now += 2
        assert not s.note("sglang", "refused", "sglang: refused")
    assert s.pending("sglang") == 5
    clock.now += 2
    assert s.note("sglang", "timeout", "sglang: probe timed out", timeout=30.0)
    assert buf.getvalue().splitlines() == [
        "<4>sglang: refused",
        "<4>sglang: refused ×5 in the last 12 s",
        "<4>sglang: probe timed out timeout=30",
    ]


def test_change_without_repeats_has_no_empty_summary() -> None:
    s, _, buf = summarizer()
    s.note("sglang", "refused", "a")
    s.note("sglang", "timeout", "b")
    assert buf.getvalue().splitlines() == ["<4>a", "<4>b"]


def test_after_flush_the_next_failure_is_logged_in_full() -> None:
    s, clock, buf = summarizer()
    s.note("sglang", "refused", "down")
    assert not s.flush("sglang")  # no repeats: no summary
    clock.now += 1
    assert s.note("sglang", "refused", "down")
    assert buf.getvalue().splitlines() == ["<4>down", "<4>down"]


def test_subjects_are_independent_and_flush_all() -> None:
    s, clock, buf = summarizer()
    s.note("a", "refused", "a down")
    s.note("b", "timeout", "b slow", level=logging.ERROR)
    clock.now += 5
    assert not s.note("a", "refused", "a down")
    assert not s.note("b", "timeout", "b slow", level=logging.ERROR)
    assert s.flush_all() == 2
    assert buf.getvalue().splitlines() == [
        "<4>a down",
        "<3>b slow",
        "<4>a: refused ×1 in the last 5 s",
        "<3>b: timeout ×1 in the last 5 s",
    ]

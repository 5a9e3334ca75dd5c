"""The README and docs/ are the user's map: every link in them (and in packaging/README.md) leads
somewhere, and every flag a `--help` lists is explained in them. In process: the flags come from
the argparse parsers themselves, not from running `genready --help`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from genready import cli
from genready.tools import benchclient

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def linked_files() -> list[Path]:
    """Where links are checked: the docs, and the packagers' notes."""
    return [*doc_files(), ROOT / "packaging" / "README.md"]


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans: a `[x](y)` in code is no link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces become hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, text: str) -> list[str]:
    """Each relative link of `text` (the contents of `path`) that leads nowhere, and why."""
    bad = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.name}: {target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            bad.append(f"{path.name}: {target}: {dest.name} has no heading #{anchor}")
    return bad


def long_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every --flag `parser --help` lists, and each of its subcommands' (--help itself aside)."""
    flags = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= long_flags(sub)
        flags |= {o for o in action.option_strings if o.startswith("--") and o != "--help"}
    return flags


def parsers() -> dict[str, argparse.ArgumentParser]:
    from genready_dev import simargs

    simulate = argparse.ArgumentParser(prog="genready simulate")
    simargs.add_arguments(simulate)
    return {
        "genready": cli.build_parser(),  # `sweep report` and `sweep restore` too: subcommands of `sweep`
        "genready simulate": simulate,
        "genready-bench-client": benchclient.build_parser(),
    }


def undocumented(flags: set[str], text: str) -> list[str]:
    return sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text))


def test_every_relative_link_resolves() -> None:
    bad = [b for path in linked_files() for b in broken_links(path, path.read_text())]
    assert not bad, "\n".join(bad)


def test_every_flag_help_lists_is_documented() -> None:
    text = "\n".join(path.read_text() for path in doc_files())
    missing = [f"{name}: {' '.join(flags)}" for name, parser in parsers().items()
               if (flags := undocumented(long_flags(parser), text))]
    assert not missing, "say what these do in README.md or docs/*.md: " + "; ".join(missing)


def test_every_bench_script_is_in_benchmarks_md() -> None:
    """A figure is only worth what reproducing it takes: docs/benchmarks.md names each script."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    missing = [p.name for p in sorted((ROOT / "bench").glob("*.py")) if f"bench/{p.name}" not in text]
    assert not missing, f"say in docs/benchmarks.md what these print and how to run them: {missing}"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A `heading`: here\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    text = ("[ok](there.md) [ok](there.md#a-heading-here) [ok](#mine) [web](https://example.org/x)\n"
            "`[code](nowhere.md)`\n\n## Mine\n\n"
            "[gone](missing.md) [no anchor](there.md#not-a-heading) [code heading](there.md#not-a-heading-1)"
            " [self](#nope)\n")
    page.write_text(text)
    bad = broken_links(page, text)
    assert [b.split(": ")[1] for b in bad] == ["missing.md", "there.md#not-a-heading",
                                               "there.md#not-a-heading-1", "#nope"], bad
    p = argparse.ArgumentParser()
    p.add_argument("--since")
    p.add_subparsers().add_parser("x").add_argument("--kill-after")
    assert long_flags(p) == {"--since", "--kill-after"}
    # --since does not count as documented by --since-when, nor --kill-after by --kill-after-x
    assert undocumented(long_flags(p), "--since-when --kill-after-x") == ["--kill-after", "--since"]
    assert undocumented(long_flags(p), "`--since TS`, --kill-after.") == []

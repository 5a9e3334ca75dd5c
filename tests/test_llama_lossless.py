"""Same prompts, same tokens on llama.cpp's real llama-server (issue 50 §5): its greedy answers with each draft
(identical, noisy, other weights) against its answers without one, through the bench client's request lines and
the report's output check (sweep/report/outputs.py). llama-server verifies every draft with the target model, so
no configuration is broken: the check must call none of them diverged or degenerate, whatever share matches
exactly; another model's answers it must call diverged. The figures measured are printed (docs/sweeps.md gives
them). Skipped when the server is not built."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from genready.sweep.report import outputs
from genready_dev.harness import PY, LlamaServer
from tests.test_llama_spec import DRAFTS, PROMPTS, SERVER_FLAGS, models, need_llama_server

__all__ = ["models"]  # the fixture, used by name


def answers(tmp: Path, name: str, server_args: list[str], dataset: Path) -> dict[str, outputs.Answer]:
    server = LlamaServer(tmp, need_llama_server(), *server_args, *SERVER_FLAGS.split())
    try:
        (tmp / name).mkdir()
        r = subprocess.run([PY, "-m", "genready.benchclient", "--url", server.url, "--api", "openai-completions",
                            "-n", str(2 * len(PROMPTS)), "-c", "2", "--max-tokens", "48", "--seed", "1",
                            "--temperature", "0", "--dataset", str(dataset),
                            "--output", str(tmp / name / "bench.jsonl")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        server.stop()
    got = outputs.read_answers([tmp / name])
    assert got is not None and len(got) == len(PROMPTS)
    return got


@pytest.mark.system
@pytest.mark.real_servers
def test_llama_servers_speculative_answers_against_its_plain_ones(models: dict[str, Path], tmp_path: Path) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    base = answers(tmp_path, "plain", ["-m", str(models["tiny"])], dataset)
    figures = {}
    for short in DRAFTS:
        spec = ["-m", str(models["tiny"]), "-md", str(models[f"draft-{short}"]), "--spec-type", "draft-simple",
                "--spec-draft-n-max", "4", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
        check = outputs.check(answers(tmp_path, short, spec, dataset), base, 0.10)
        figures[short] = (check.match, check.prefix_median, check.prefix_p10, check.marked)
        print(f"draft {short}: output_match {check.match}, prefix median {check.prefix_median}, "
              f"p10 {check.prefix_p10}, marked {check.marked} ({check.claim})")
        assert check.ran and check.compared == len(PROMPTS)
        assert not check.marked, check.claim  # a verified draft is no broken configuration
    # and the check can fail on this server: another model's greedy answers (the draft with other weights served as
    # the target) are what a broken verifier would emit
    wrong = outputs.check(answers(tmp_path, "wrong", ["-m", str(models["draft-other"])], dataset), base, 0.10)
    print(f"another model: output_match {wrong.match}, prefix p10 {wrong.prefix_p10}, marked {wrong.marked}")
    assert wrong.diverged and wrong.match == 0.0, wrong
    assert figures

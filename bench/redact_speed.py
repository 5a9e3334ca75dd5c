#!/usr/bin/env python3
"""What masking secrets and escaping control characters cost.

A failed start's last lines pass through `redact` before they reach /status, and everything from a
server through `escape` before a terminal or the log. One line per case: a typical start-up line
(vLLM's `non-default args`, SGLang's `server_args=`), 20 such lines as one failed start shows them,
and 64 KiB lines of hostile shapes that made an earlier version of the rules quadratic.

    .venv/bin/python bench/redact_speed.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

from genready.redact import escape, redact, redact_lines

VLLM = ("INFO 08-06 21:23:02 [cli_args.py:309] non-default args: {'port': 8011, 'model': '/models/m', "
        "'api_key': ['sk-vllm-list-1', 'sk-vllm-list-2'], 'hf_token': 'hf_vllmtoken3', 'tensor_parallel_size': 2}")
SGLANG = ("[2026-12-03 07:00:01] server_args={'model_path': 'qwen', 'tokenizer_path': 'qwen', 'ssl_keyfile': None, "
          "'ssl_keyfile_password': 'kpw-5', 'api_key': 'sk-sgl-6', 'admin_api_key': 'sk-adm-7', "
          "'max_total_tokens': 4096, 'skip_tokenizer_init': False}")
HOSTILE = {
    "64 KiB of 'api_key=1, '": "api_key=1, " * 6_000,
    "64 KiB of 'secret'": "secret" * 10_000,
    "64 KiB of 'HF_TOKEN '": "HF_TOKEN " * 7_000,
    "64 KiB of '--api-key w w w'": "--api-key " + "w " * 30_000,
    "64 KiB of ESC[2J": "\x1b[2J" * 16_000,
}


def timed(fn: Callable[[], object], n: int) -> float:
    """Seconds per call, best of 3 rounds of n calls."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def main() -> None:
    print(f"redact, vLLM's non-default args line: {timed(lambda: redact(VLLM), 2000) * 1e6:.0f} µs")
    print(f"redact, SGLang's server_args line:    {timed(lambda: redact(SGLANG), 2000) * 1e6:.0f} µs")
    lines = [VLLM, SGLANG] * 10
    print(f"redact_lines, a failed start's 20 lines: {timed(lambda: redact_lines(lines), 200) * 1e3:.2f} ms")
    print(f"escape, a 200-char line without controls: {timed(lambda: escape(VLLM), 20000) * 1e6:.1f} µs")
    for name, text in HOSTILE.items():
        fn = (lambda t=text: escape(t)) if "ESC" in name else (lambda t=text: redact(t))
        print(f"{'escape' if 'ESC' in name else 'redact'}, {name}: {timed(fn, 1) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()

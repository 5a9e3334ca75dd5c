"""Placeholder: the simulator (being written)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=30000)


def main(args: argparse.Namespace) -> int:
    return 0

"""Where the `baseline` configuration runs in a sweep: once per client setting, before the plan's server
configurations and, with `baseline_every = N`, again after every N of them (and after the last), so each
point lies between two baseline rounds and a baseline that moved in between is seen (speedup.py).

A *client setting* is a point's values for the axes its drop-in does not use (the command's: concurrency,
request rate): what varies inside a server configuration. The baseline runs at every client setting the
groups it brackets run, with the baseline's server-side values in the plan's drop-in (or its own drop-in).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from genready.sweep.plan import Plan, Point, Scalar


def client_of(plan: Plan, point: Point) -> dict[str, Scalar]:
    """The point's client setting: its values for the axes the plan's drop-in does not use."""
    server = set(plan.dropin.names) if plan.dropin else set()
    return {k: v for k, v in point.values if k not in server}


def setting_key(plan: Plan, point: Point) -> str:
    """The client setting a baseline run and a plan point share when the baseline ran for it: the point's
    client setting less the baseline's own names (schedule() puts the baseline's values over the client's)."""
    own = set(dict(plan.baseline.values)) if plan.baseline else set()
    return _key({k: v for k, v in client_of(plan, point).items() if k not in own})


def _key(values: dict[str, Scalar]) -> str:
    return json.dumps(values, sort_keys=True)


def schedule(plan: Plan, groups: Sequence[tuple[Point, ...]]) -> list[tuple[Point, ...]]:
    """`groups` (in run order) with the baseline's rounds put in: round 1 first, and with `baseline_every`
    one after every N groups and after the last. A round runs the baseline at the client settings of the
    groups next to it, in plan order; its points are numbered past the plan's (each round's its own, so
    every run of the baseline is a point of its own in the results). Without a baseline: `groups`."""
    if plan.baseline is None or not groups:
        return list(groups)
    every = plan.baseline_every or len(groups)
    chunks = [list(groups[i:i + every]) for i in range(0, len(groups), every)]
    out: list[tuple[Point, ...]] = []
    index = len(plan.points)
    rounds = len(chunks) + 1 if plan.baseline_every else 1
    for r in range(1, rounds + 1):
        near = chunks[max(0, r - 2):r] if plan.baseline_every else chunks  # the chunks before and after this round
        settings: dict[str, dict[str, Scalar]] = {}
        for chunk in near:
            for g in chunk:
                for p in g:
                    settings.setdefault(_key(client_of(plan, p)), client_of(plan, p))
        pts = []
        for client in settings.values():
            index += 1
            pts.append(Point(index, (*plan.baseline.values, *((k, v) for k, v in client.items()
                                                              if k not in dict(plan.baseline.values))), baseline=r))
        out.append(tuple(pts))
        if r <= len(chunks):
            out += chunks[r - 1]
    return out


def round_before(groups: Sequence[tuple[Point, ...]]) -> dict[int, int]:
    """Point index -> the baseline round that ran last before it (0: none), over a schedule()'s groups."""
    last, out = 0, {}
    for g in groups:
        for p in g:
            if p.baseline:
                last = p.baseline
            else:
                out[p.index] = last
    return out

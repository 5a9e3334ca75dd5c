"""The contract every server kind keeps, run against each `servers.kinds.KINDS` entry and, where genready's
simulator imitates it, against its profile (`genready simulate --profile`): a kind added to KINDS is tested
here the moment it exists, with no table to extend. uvicorn's contract suite is the model
(tests/protocols/test_http.py: nearly every test takes the `http_protocol_cls` fixture and runs against each
implementation).

In-process: the kind is found by its name and by its command line, its flags mean settings init knows, a
simulated kind has a profile of its own. Against the simulator (a real process on loopback): its health and
model routes answer, its counter page is read by its own reader and by the kind-less (auto) one alike, the
probe generates with the api init proposes, and the bench client measures one accept length from it, with
the kind named and with `auto`.
"""

from __future__ import annotations

import io
import json
import urllib.request
from collections.abc import Iterator

import pytest

from genready import config
from genready.apis import APIS
from genready.probe.probe import Prober
from genready.servers import kinds
from genready.servers.kinds import ServerKind
from genready.servers.metricspage import NotMetrics
from genready.tools import benchrun
from genready.tools.prompts import Prompt
from genready_dev.harness import free_port
from genready_dev.simprofiles import PROFILES
from tests.test_sim import Sim

ALL = [pytest.param(k, id=k.name) for k in kinds.KINDS]
SIMULATED = [pytest.param(kinds.BY_NAME[name], id=name) for name in kinds.SIMULATED.values()]
# What a command-line flag or variable of a kind may set: the settings `init` writes (tools/unitinit.py)
SETTINGS = frozenset({"host", "port", "uds", "key", "key_file", "model", "weights", "tls", "prefix"})
SPEC_ACCEPT = 2.5  # the simulator's accept length under --spec-accept


@pytest.fixture(params=ALL)
def kind(request: pytest.FixtureRequest) -> ServerKind:
    k: ServerKind = request.param
    return k


def command_lines(k: ServerKind) -> list[list[str]]:
    """Every command line its recognition data describes, each with a model argument after it."""
    return [*(["python3", "-m", m, "--port", "1"] for m in k.modules),
            *(c for p in k.serve_programs for c in ([p, "serve", "M"], ["python3", "-m", p, "serve", "M"])),
            *([p, "M"] for p in k.programs)]


# --- in-process ----------------------------------------------------------------------------------------------

def test_the_kind_is_found_by_its_name_and_by_each_command_line_it_is_started_with(kind: ServerKind) -> None:
    assert kinds.BY_NAME[kind.name] is kind
    lines = command_lines(kind)
    assert lines, f"{kind.name}: init cannot recognise it (no module, serve program or program)"
    for argv in lines:
        found = kinds.by_command(argv, argv[0])
        assert found is not None and found[0] is kind, argv
        assert found[1][-1] in ("1", "M"), (argv, found[1])  # its own arguments follow
    assert kind.label in kinds.known_words()


def test_its_flags_and_variables_set_settings_init_knows(kind: ServerKind) -> None:
    assert set(kind.flags.values()) | set(kind.env.values()) <= SETTINGS
    assert all(f.startswith("-") for f in kind.flags)
    assert kind.api in APIS and (not kind.native_api or kind.native_api in APIS)


def test_its_counter_page_reader_refuses_what_is_not_its_format(kind: ServerKind) -> None:
    """A reader says NotMetrics, it never raises anything else nor reads garbage as counters."""
    for body in (b"<html>not found</html>\n", b"\xff\xfe{", b'{"a": [1, 2'):
        try:
            got = kind.metrics.read(body)
        except NotMetrics:
            continue
        assert got == {}, (body, got)
    assert kind.metrics.route.startswith("/")
    assert kind.metrics.route in kinds.metrics_routes(None)


def test_a_simulated_kind_has_its_own_profile_and_its_argv_is_served_as_it() -> None:
    assert set(PROFILES) - {""} == set(kinds.SIMULATED)
    for name, kind_name in kinds.SIMULATED.items():
        kind = kinds.BY_NAME[kind_name]
        assert kind.sim_profile == name and PROFILES[name].kind is kind and PROFILES[name].name == name
        found = kinds.serving(["genready", "simulate", "--profile", name, "--port", "1"])
        assert found is not None and found[0] is kind


# --- against the simulator -----------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=SIMULATED)
def served(request: pytest.FixtureRequest) -> Iterator[tuple[ServerKind, Sim]]:
    k: ServerKind = request.param
    sim = Sim(free_port(), "--profile", k.sim_profile, "--load-seconds", "0", "--warmup-seconds", "0",
              "--spec-accept", str(SPEC_ACCEPT))
    try:
        sim.wait_log_sync("ready")
        yield k, sim
    finally:
        sim.proc.terminate()
        sim.proc.wait(10)


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


def api_of(k: ServerKind) -> str:
    return k.native_api or k.api


@pytest.mark.system  # starts simulator processes
def test_its_health_and_model_routes_answer(served: tuple[ServerKind, Sim]) -> None:
    k, sim = served
    if k.health_route:
        assert get(sim.url + k.health_route)[0] == 200
    status, body = get(sim.url + k.models_route)
    assert status == 200 and json.loads(body)["data"], body


@pytest.mark.system
def test_its_counter_page_is_read_by_its_reader_and_by_the_auto_one(served: tuple[ServerKind, Sim]) -> None:
    k, sim = served
    status, body = get(sim.url + k.metrics.route)
    assert status == 200, body[:200]
    own = kinds.read_metrics(k, k.metrics.route, body)
    auto = kinds.read_metrics(None, k.metrics.route, body)
    assert own.values == auto.values and own.cumulative == auto.cumulative == k.metrics.cumulative


@pytest.mark.system
async def test_the_probe_generates_with_the_api_init_proposes(served: tuple[ServerKind, Sim]) -> None:
    k, sim = served
    t = config.parse({"targets": {"t": {"unit": "t.service", "url": sim.url, "api": api_of(k)}}}).targets["t"]
    prober = Prober(t)
    try:
        result = await prober.probe(sim.pid)
    finally:
        await prober.close()
    assert result.ok, result


@pytest.mark.system
@pytest.mark.parametrize("named", [True, False], ids=["named", "auto"])
async def test_the_bench_client_measures_one_accept_length(served: tuple[ServerKind, Sim], named: bool) -> None:
    """Whatever the kind reports acceptance by (its answers, its counter page, its info route), the run gives
    one accept length, and the same with --kind NAME as with --kind auto."""
    k, sim = served
    server = benchrun.ServerOptions(sim.url, api_of(k), kind=k.name if named else benchrun.AUTO)
    load = benchrun.LoadOptions(4, 2, 12, 10, [Prompt(text="hi")], stream=False)
    summary = await benchrun.run(server, load, benchrun.Progress(4, io.StringIO()))
    assert summary.ok == 4, summary.errors()
    length, source = summary.accept()
    assert length is not None and abs(length - SPEC_ACCEPT) < 0.6, (length, source)
    assert source

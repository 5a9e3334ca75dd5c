"""The words every surface shares: one definition each, one meaning each.

The gate decides a target's `State`; the probe classifies a `Failure`; the API counts its
`REFUSALS`. Metrics, the OpenAPI document, the outputs and the CLI import the words from here,
never the module that decides them, so a surface that names a state does not depend on the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

from genready.compat import StrEnum


class Instance(NamedTuple):
    """One start of a unit, as systemd names it: a verification belongs to exactly one."""

    invocation_id: str
    main_pid: int


class State(StrEnum):
    """A target's state: the vocabulary of /ready, /status, the state metric and the logs."""

    ABSENT = "absent"  # the unit does not exist
    INACTIVE = "inactive"  # inactive, failed or deactivating
    STARTING = "starting"  # a job is pending, or the unit is activating without a MainPID
    LOADING = "loading"  # the MainPID runs; no generation verified yet
    WARMING = "warming"  # some, not yet `warmup`, consecutive generations verified
    READY = "ready"  # is_ready() holds
    STUCK = "stuck"  # still not verified after load_timeout
    UNKNOWN = "unknown"  # no connection to systemd
    REJECTED = "rejected"  # the server is up and refuses the probe (4xx but 408/429, a pinned model it does not list)


class Revocation(StrEnum):
    """Why readiness was revoked: the vocabulary of start records and the revocation metric."""

    PID_CHANGED = "pid_changed"
    INVOCATION_CHANGED = "invocation_changed"
    INACTIVE = "inactive"  # the unit left `active`
    JOB_QUEUED = "job_queued"  # a stop/restart job is pending
    RECHECK_FAILED = "recheck_failed"  # failure_threshold rechecks in a row failed
    BUS_LOST = "bus_lost"  # no connection to systemd: the instance cannot be vouched for
    CONFIG_CHANGED = "config_changed"  # a reload changed the target's probe settings
    # A process outside the verified instance listens where the target's url connects (probe/listen.py)
    FOREIGN_LISTENER = "foreign_listener"


class Failure(StrEnum):
    """Why a probe failed; a stable vocabulary for logs, metrics and the API."""

    REFUSED = "refused"  # no connection, or it was reset/closed before any answer
    TIMEOUT = "timeout"  # no complete answer within probe_timeout
    HTTP_STATUS = "http_status"  # an answer, but not 200: 5xx, 408, 429 (the server may get there)
    # The server's own health route (health_path) answered, but not 200: it says it is not ready
    # (SGLang still warming up or draining, llama.cpp loading), whatever a generation would do.
    UNHEALTHY = "unhealthy"
    REJECTED = "rejected"  # the server is up and refuses the probe: 4xx but 408/429, or a pinned model it does not list
    TLS = "tls"  # the TLS handshake or session failed: certificate verification, client certificate, …
    BAD_RESPONSE = "bad_response"  # 200 but not JSON, wrong shape, 0 tokens, or over the size cap
    FOREIGN_OWNER = "foreign_owner"  # served by a process that is not the MainPID or its descendant, or unprovable
    STALE_INSTANCE = "stale_instance"  # the unit changed around the probe (set by the caller, never here)
    # genready itself is out of file descriptors or memory (EMFILE, ENFILE, ENOMEM, ENOBUFS): says
    # nothing about the server, so it must not read as "refused".
    LOCAL_RESOURCES = "local_resources"
    # An exception inside genready's probe that no rule classifies (a bug: logged with its traceback).
    PROBE_ERROR = "probe_error"


class HealthRoute(StrEnum):
    """What the server's own health route (health_path) said at the current start: /status's `health`."""

    OFF = "off"  # health_path = "": not asked
    OK = "ok"  # its last answer was 200
    UNHEALTHY = "unhealthy"  # its last answer was another status: the server says it is not ready
    # It answered 404 or 405: the server has no such route (llama-cpp-python's server has none).
    # For the rest of that start it is not asked again, and readiness rests on the generation alone.
    ABSENT = "absent"


class KindSource(StrEnum):
    """Where a target's server kind came from (probe/serverkind.py): /status's `kind.from`."""

    CONFIG = "config"  # the target's `kind` key
    PROCESS = "process"  # the command line of the process that serves it (/proc/PID/cmdline)
    EXEC_START = "ExecStart"  # the unit's ExecStart= words
    UNKNOWN = "unknown"  # none of them names a kind genready knows


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe."""

    ok: bool
    failure: Failure | None  # None iff ok
    detail: str  # human text: what was seen, who served it
    served_by_pid: int | None  # the process holding the server side, when the owner was checked and found
    seconds: float  # wall time of the whole probe
    tokens: int  # tokens the server says it generated (1 when only non-empty text proves it)
    status: int | None = None  # the HTTP status of the last answer, if one came (for the retry schedule)


# systemd's ActiveState values, grouped by what they say about the unit's MainPID
# (org.freedesktop.systemd1(5)). One home, so the gate, the history and the sweep agree.
DOWN: Final = frozenset({"inactive", "failed", "deactivating"})  # no process to vouch for
ALIVE: Final = frozenset({"activating", "active", "reloading"})  # a process runs (auto-restart aside)

# /ready's reason, first word, while the systemd manager does not answer a read within worker.READ_TIMEOUT
# (SIGSTOPped, or busy in a long daemon-reload): genready cannot vouch for any instance meanwhile.
# genready_systemd_responsive is 0 and /status's systemd_responsive false for as long.
SYSTEMD_UNRESPONSIVE: Final = "systemd_unresponsive"

# Why the API refused a connection or long-poll (the `why` label of genready_api_refused_total).
# "host": a request whose Host: names neither genready nor an IP address (answered 421: DNS rebinding).
REFUSALS: Final[tuple[str, ...]] = ("connections", "long_polls", "read_timeout", "evicted", "host")

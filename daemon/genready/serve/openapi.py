"""The HTTP API's contract as OpenAPI 3.1, served at /openapi.json and checked by the tests."""

from __future__ import annotations

from typing import Any

from genready import __version__
from genready.vocab import SYSTEMD_UNRESPONSIVE, Failure, HealthRoute, KindSource, Revocation, State

_STR_OR_NULL: dict[str, Any] = {"type": ["string", "null"]}
_INT_OR_NULL: dict[str, Any] = {"type": ["integer", "null"]}
_NUM_OR_NULL: dict[str, Any] = {"type": ["number", "null"]}
# How long loads usually take: in /status and in /ready's 503 answer.
LOAD_CLOCK: dict[str, Any] = {
    "expected_load_seconds": {**_NUM_OR_NULL, "description": "median of the last (up to) 5 verified loads with "
                              "the same ExecStart=, else of the unit's last 5; null without any"},
    "loading_seconds": {**_NUM_OR_NULL, "description": "while not ready: seconds since this start's process began"},
    "eta_seconds": {**_NUM_OR_NULL, "description": "while not ready: expected_load_seconds minus loading_seconds "
                    "(0 when overdue); null without history"},
}
# A process holding GPU memory that is not the target's current start's (serve/gpuwatch.py).
STRAY: dict[str, Any] = {
    "type": "object",
    "required": ["gpu", "pid", "bytes", "role", "invocation_id", "unit", "command", "why", "line"],
    "properties": {
        "gpu": {"type": "string", "description": "the GPU's UUID"}, "pid": {"type": "integer"},
        "bytes": {**_INT_OR_NULL, "description": "GPU memory it holds there; null where the driver does not say"},
        "role": {"type": "string", "const": "stray"},
        "invocation_id": {**_STR_OR_NULL, "description": "the earlier start it was left by; null: a start genready "
                          "has no record of"},
        "unit": {**_STR_OR_NULL, "description": "the unit whose cgroup it is in; null: none (it escaped)"},
        "command": {"type": "string", "description": "its command line, secrets masked, control characters "
                    "escaped, at most 300 characters"},
        "why": {"type": "string", "description": "how it is known to be that start's"},
        "line": {"type": "string", "description": "the same in one line for people, with how to end it "
                 "(genready never does)"},
    },
}
_BYTES_PER_GPU: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "integer"}}
GPU: dict[str, Any] = {
    "type": ["object", "null"],
    "description": "who holds the GPUs' memory, as last read (daemon.gpu_interval); null: not read (off, no "
                   "nvidia-smi or NVML here, or not yet)",
    "required": ["read_at", "error", "current_bytes", "stray_bytes", "strays"],
    "properties": {
        "read_at": {"type": "string"}, "error": {**_STR_OR_NULL, "description": "why the last read failed"},
        "current_bytes": {**_BYTES_PER_GPU, "description": "per GPU UUID: memory held by the current start"},
        "stray_bytes": {**_BYTES_PER_GPU, "description": "per GPU UUID: memory held by strays"},
        "strays": {"type": "array", "items": STRAY},
    },
}
_GPU_STRAYS: dict[str, Any] = {
    "type": ["array", "null"], "items": STRAY,
    "description": "the strays holding GPU memory when it ended (the likely cause of a CUDA out-of-memory); "
                   "null: not read",
}
FAILURE: dict[str, Any] = {
    "type": ["object", "null"],
    "description": "the last start that ended before it was verified (since genready started), with its own "
                   "last 20 lines of output, secrets masked",
    "properties": {
        "invocation_id": {"type": "string"}, "main_pid": {"type": "integer"}, "started_at": _STR_OR_NULL,
        "ended_at": _STR_OR_NULL, "result": {**_STR_OR_NULL, "description": "systemd's Result="},
        "exit_code": {**_STR_OR_NULL, "description": "exited, killed, dumped"}, "exit_status": _INT_OR_NULL,
        "journal": {"type": "array", "items": {"type": "string"}}, "gpu_strays": _GPU_STRAYS,
    },
}
# /ready's 503: the start the caller waits for ended before it was verified.
START_FAILED: dict[str, Any] = {
    "type": ["object", "null"],
    "description": "the newest start whose process began after since= (without since=: the newest start) "
                   "that ended before it was verified, or null. With since=, a long-poll answers at once "
                   "when this appears with restarting false: waiting longer changes nothing",
    "properties": {
        **FAILURE["properties"],
        "journal": {"type": "array", "items": {"type": "string"},
                    "description": "its last lines of output, secrets masked ([] until read, or if none)"},
        "restarting": {"type": "boolean", "description": "systemd may start the unit again by itself (Restart=: "
                       "activating/auto-restart, a job pending, a newer start running); false once the unit has "
                       "stayed down with no job pending for 0.2 s"},
    },
    "required": ["invocation_id", "result", "ended_at", "journal", "restarting"],
}

# The instance runs another ExecStart=/Environment= than its unit has now.
CONFIG_CHANGES: dict[str, Any] = {
    "config_changed_since_start": {
        "type": "boolean", "description": "the unit's ExecStart= or Environment= differ from what this "
        "process was started with (edited and reloaded, not restarted): ready, but not running the "
        "unit's configuration; guard and sweep refuse it"},
    "config_changes": {"type": "array", "items": {"type": "string"},
                       "description": "each difference, e.g. 'Environment: A=1 is now A=2' (secrets masked)"},
}
READY = {
    "type": "object",
    "required": ["ready", "target", "unit", "pid", "invocation_id", "ready_since", "load_seconds"],
    "properties": {
        "ready": {"type": "boolean", "const": True},
        "target": {"type": "string"},
        "unit": {"type": "string"},
        "pid": {"type": "integer", "description": "the verified MainPID"},
        "invocation_id": {"type": "string", "description": "systemd InvocationID, 32 hex digits"},
        "ready_since": {"type": "string", "description": "ISO 8601 time of the verification"},
        "load_seconds": {**_NUM_OR_NULL, "description": "process start -> verified generation"},
        **CONFIG_CHANGES,
    },
}
STATES: dict[str, Any] = {"type": "string", "enum": [s.value for s in State]}
LAST_ERROR: dict[str, Any] = {
    "type": ["string", "null"], "pattern": "^(" + "|".join(f.value for f in Failure) + "): ",
    "description": "the last probe failure, `CLASS: detail`; CLASS one of " + ", ".join(f.value for f in Failure)}
NOT_READY: dict[str, Any] = {
    "type": "object",
    "required": ["ready", "target", "unit", "state", "reason", "pid", "invocation_id", "waiting_since", "probes",
                 "last_error"],
    "properties": {
        "ready": {"type": "boolean", "const": False},
        "target": {"type": "string"},
        "unit": {"type": "string"},
        "state": STATES,
        "reason": {"type": "string", "description": f"why not; begins with `{SYSTEMD_UNRESPONSIVE}:` while the "
                                                    "systemd manager does not answer"},
        "pid": {**_INT_OR_NULL, "description": "systemd's MainPID now (not verified)"},
        "invocation_id": _STR_OR_NULL,
        "waiting_since": {**_STR_OR_NULL, "description": "when probing of this start began"},
        "probes": {"type": "integer"},
        "last_error": LAST_ERROR,
        **LOAD_CLOCK,
        "start_failed": START_FAILED,
    },
}
ALL_READY = {
    "type": "object", "required": ["ready", "targets"],
    "properties": {"ready": {"type": "boolean"}, "targets": {"type": "array", "items": {}}},
}
ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
RECORD = {
    "type": "object",
    "required": ["target", "unit", "invocation_id", "main_pid", "started_at", "active_at", "ended_at", "result",
                 "exit_code", "exit_status", "n_restarts", "ready_at", "load_seconds", "probes", "served_by_pid",
                 "revoked_at", "revoke_reason"],
    "properties": {
        "target": {"type": "string"}, "unit": {"type": "string"}, "invocation_id": {"type": "string"},
        "main_pid": {"type": "integer"}, "started_at": _STR_OR_NULL, "active_at": _STR_OR_NULL,
        "ended_at": _STR_OR_NULL, "result": _STR_OR_NULL, "exit_code": _STR_OR_NULL,
        "exit_status": _INT_OR_NULL, "n_restarts": {"type": "integer"}, "ready_at": _STR_OR_NULL,
        "load_seconds": _NUM_OR_NULL, "probes": _INT_OR_NULL, "served_by_pid": _INT_OR_NULL,
        "revoked_at": _STR_OR_NULL,
        "revoke_reason": {"type": ["string", "null"], "enum": [*(r.value for r in Revocation), None]},
        "exec_fingerprint": {**_STR_OR_NULL, "description": "digest of ExecStart= at this start"},
        "exec_start": {"type": ["array", "null"], "items": {"type": "string"},
                       "description": "ExecStart= this start was started with, a line per command (secrets masked)"},
        "environment": {"type": ["array", "null"], "items": {"type": "string"},
                        "description": "Environment= this start was started with, KEY=VALUE (secrets masked)"},
    },
}
KIND = {
    "type": "object", "required": ["name", "from", "pid"],
    "description": "the server kind the unit runs, resolved once per start (and again once it is verified)",
    "properties": {
        "name": {**_STR_OR_NULL, "description": "a server kind's name (sglang, vllm, …); null: not known"},
        "from": {"type": "string", "enum": [str(s) for s in KindSource],
                 "description": "config: the target's kind key; process: the command line of the process that "
                 "serves it (/proc/PID/cmdline); ExecStart: the unit's ExecStart=; unknown: none of them names one"},
        "pid": {**_INT_OR_NULL, "description": "the process whose command line was read"},
    },
}
TARGET_STATUS = {
    "type": "object",
    "required": ["target", "unit", "state", "reason", "ready", "pid", "invocation_id", "ready_since",
                 "load_seconds", "waiting_since", "probes", "last_error", "snapshot", "records"],
    "properties": {
        "target": {"type": "string"}, "unit": {"type": "string"}, "state": STATES,
        "reason": {"type": "string"}, "ready": {"type": "boolean"}, "pid": _INT_OR_NULL,
        "invocation_id": _STR_OR_NULL, "ready_since": _STR_OR_NULL, "load_seconds": _NUM_OR_NULL,
        "waiting_since": _STR_OR_NULL, "probes": {"type": "integer"}, "last_error": LAST_ERROR,
        "model": {**_STR_OR_NULL, "description": 'the model the probe asks for and why, e.g. model "a" (first of '
                  "2 listed: a, b); null for an API without model names"},
        "health": {"type": ["string", "null"], "enum": [*(h.value for h in HealthRoute), None],
                   "description": "what the server's own health route (health_path) said at this start: ok, "
                   "unhealthy (its last answer was not 200), absent (it answered 404/405: the server has none, and "
                   "readiness rests on the generation alone), off (health_path = \"\"); null: not asked yet"},
        **CONFIG_CHANGES,
        "warnings": {"type": "array", "items": {"type": "string"},
                     "description": "settings that weaken the proof, e.g. tls_verify = false; a drop-in left by a "
                     "genready sweep that is gone (genready sweep restore TARGET)"},
        "foreign_listeners": {
            "type": "array", "description": "LISTEN sockets on an address the url resolves to, at its port, held by "
            "processes outside the unit's current start (not the MainPID or a descendant), at the last look: the "
            "kernel hands them connections to the url, so the target is not ready while there are any "
            "(revoke_reason foreign_listener)",
            "items": {"type": "object", "properties": {
                "pid": {"type": "integer"}, "comm": {"type": "string"}, "uid": {"type": "integer"},
                "address": {"type": "string"}, "port": {"type": "integer"}}}},
        "snapshot": {"type": ["object", "null"], "description": "systemd's view: ActiveState, MainPID, …"},
        "records": {"type": "array", "items": RECORD, "description": "newest 20 starts, newest first"},
        **LOAD_CLOCK, "last_failure": FAILURE, "gpu": GPU, "kind": KIND,
    },
}
STATUS = {
    "type": "object",
    "required": ["version", "uptime_seconds", "bus", "bus_connected", "owner_proof", "config", "targets"],
    "properties": {
        "version": {"type": "string"}, "uptime_seconds": {"type": "number"}, "bus": {"type": "string"},
        "bus_connected": {"type": "boolean"}, "bus_error": _STR_OR_NULL,
        "systemd_responsive": {"type": "boolean", "description": "false while the systemd manager does not answer"},
        "systemd_silent_seconds": {"type": "number", "description": "for how long it has not (0 while it does)"},
        "owner_proof": {"type": "string", "description": "'available', or why owner proof cannot work here"},
        "config": {"type": "string"}, "config_error": _STR_OR_NULL,
        "restart_needed": {"type": "array", "items": {"type": "string"},
                           "description": "settings a reload changed that only a restart of genready applies "
                                          "(daemon.listen, bus, state_dir, runtime_dir); the running values stay"},
        "systemd_ready_sent": {"type": "boolean"}, "fresh_reads": {"type": "integer"},
        "targets": {"type": "object", "additionalProperties": TARGET_STATUS},
    },
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_READY_PARAMS = [
    {"name": "wait", "in": "query", "schema": {"type": "number", "minimum": 0, "maximum": 3600},
     "description": "long-poll up to this many seconds for readiness (capped at 3600), then answer"},
    {"name": "since", "in": "query", "schema": {"type": "number", "minimum": 0},
     "description": "Unix time: only a start whose process began after it counts"},
    {"name": "since_monotonic", "in": "query", "schema": {"type": "number", "minimum": 0},
     "description": "CLOCK_MONOTONIC seconds (systemd's *TimestampMonotonic clock, shared by the host's processes): "
                    "only a start whose process began after it counts; decides instead of since=, and a step of "
                    "the wall clock does not move it (genready restart sends both)"},
    {"name": "pid", "in": "query", "schema": {"type": "integer", "minimum": 1},
     "description": "require that the verified MainPID is this one"},
    {"name": "invocation", "in": "query", "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
     "description": "require that the verified InvocationID is this one"},
]
_ERRORS = {
    "400": _json(ERROR, "bad query: the reason names the parameter"),
    "405": _json(ERROR, "only GET and HEAD"),
}


def spec() -> dict[str, Any]:
    """The OpenAPI document. Every route of api.make_app is here, and nothing else."""
    ready_doc = ("200 only if a generation served by the unit's current MainPID succeeded and a systemd read "
                 "begun after this request still shows that instance active with no job pending.")
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "genready", "version": __version__,
                 "description": "Read-only API: is the LLM server the unit runs now verified to generate?"},
        "paths": {
            "/": {"get": {
                "summary": "the status page: every target's state, load, probes, last failure and newest starts",
                "description": "An HTML page for a browser (and for any Accept: that does not name "
                               "application/json above text/html, such as curl's */*), sent with a strict "
                               "Content-Security-Policy; it redraws itself from /status every 2 s. With "
                               "Accept: application/json, the /status document.",
                "responses": {"200": {"description": "the page, or /status's document", "content": {
                    "text/html": {}, "application/json": {"schema": STATUS}}}, "405": _ERRORS["405"]}}},
            "/ready": {"get": {
                "summary": "are all targets ready?", "description": ready_doc, "parameters": _READY_PARAMS,
                "responses": {"200": _json(ALL_READY, "every target ready"),
                              "503": _json(ALL_READY, "not every target ready; targets lists those that are not"),
                              **_ERRORS}}},
            "/ready/{target}": {"get": {
                "summary": "is this target ready?", "description": ready_doc,
                "parameters": [{"name": "target", "in": "path", "required": True, "schema": {"type": "string"}},
                               *_READY_PARAMS],
                "responses": {"200": _json(READY, "ready"), "503": _json(NOT_READY, "not ready, and why"),
                              "404": _json(ERROR, "no such target"), **_ERRORS}}},
            "/status": {"get": {"summary": "every target's state and newest start records",
                                "responses": {"200": _json(STATUS, "status"), "405": _ERRORS["405"]}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
                "200": {"description": "text exposition format", "content": {"text/plain": {}}},
                "405": _ERRORS["405"]}}},
            "/openapi.json": {"get": {"summary": "this document", "responses": {
                "200": {"description": "OpenAPI 3.1", "content": {"application/json": {}}}}}},
        },
    }
    for path in doc["paths"].values():  # every route checks Host: first (httplimits.HostCheck)
        path["get"]["responses"]["421"] = _json(ERROR, "the Host: header names neither localhost, an IP address "
                                                "nor a name in daemon.allowed_hosts (DNS rebinding)")
    return doc

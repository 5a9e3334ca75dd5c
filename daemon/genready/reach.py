"""How to reach a target, built once with the config: its `url` parsed into an `Endpoint` (scheme,
host, port, path prefix, Host: header, unix socket path; nothing else parses a target's url) and its
TLS client context (`client_context`: a bad PEM file is then a config error, exit 78), shared by
its probes, the listen watch and the bench client; and TLS errors in an admin's words.

A core module: the config builds both, `probe/`, `tools/` and `sweep/` read them. `ssl` is imported
only when a TLS context is built or a TLS error described: a config without an https target never
loads it (`genready wait` in an ExecCondition= starts fast, bench/cli_start.py).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import quote, urlsplit

if TYPE_CHECKING:
    import ssl


def has_userinfo(v: str) -> bool:
    try:
        parts = urlsplit(v)
    except ValueError:
        return "@" in v
    return parts.username is not None or parts.password is not None


_URL_EXPECTED: Final = ("an http:// or https:// URL with a host (e.g. http://127.0.0.1:30000), "
                       "or unix:/absolute/path of a unix socket")
# What a path may hold unquoted (RFC 3986 pchar and "/"): the rest is percent-encoded once, here.
_PATH_SAFE: Final = "/%:@!$&'()*+,;=-._~"


@dataclass(frozen=True)
class Endpoint:
    """A target's `url` (with `path_prefix` for a unix socket), parsed once, when the config is
    read: where the probe connects and what it sends as Host:, the port the listen watch looks
    at, the base URL the bench client sends to. Nothing else parses a target's url."""

    scheme: str  # "http", "https" or "unix"
    host: str  # without IPv6 brackets; "localhost" on a unix socket (the Host: header's name)
    port: int  # the url's port, else the scheme's default; 0 on a unix socket
    path_prefix: str  # the path every route is under: percent-quoted, no trailing "/" ("" for none)
    host_header: str  # Host: as the url spells it: "[::1]:8000", or no port when the url gives none
    unix_path: str | None = None

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def numeric_host(self) -> bool:
        """An IP address (no name lookup needed), as opposed to a host name."""
        try:
            ipaddress.ip_address(self.host.split("%", 1)[0])
        except ValueError:
            return False
        return True

    @property
    def where(self) -> str:
        """For messages: `unix:PATH` or `HOST:PORT`."""
        return f"unix:{self.unix_path}" if self.unix_path is not None else f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """`scheme://host[:port]/prefix`, for an HTTP client library (not for a unix socket)."""
        return f"{self.scheme}://{self.host_header}{self.path_prefix}"


def endpoint(url: str, path_prefix: str = "") -> Endpoint:
    """Parse a target url; ValueError says what was expected (the config's message for `url`)."""
    if url.startswith("unix:"):
        if not os.path.isabs(url[5:]) or "\0" in url:
            raise ValueError(_URL_EXPECTED)
        return Endpoint("unix", "localhost", 0, quote(path_prefix.rstrip("/"), safe=_PATH_SAFE), "localhost",
                        url[5:])
    if has_userinfo(url):
        # Never used for anything, and shown to every local user by /status and check-config.
        raise ValueError("a URL without user:password@ (credentials do not belong in a URL; put an API key in "
                         "api_key_file)")
    try:  # urlsplit itself raises on e.g. "http://[::1"; .port on a port outside 0-65535
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(_URL_EXPECTED) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise ValueError(_URL_EXPECTED)
    if parts.query or parts.fragment:
        raise ValueError("a base URL without query or fragment")
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return Endpoint(parts.scheme, host, port or (443 if parts.scheme == "https" else 80),
                    quote(parts.path.rstrip("/"), safe=_PATH_SAFE), f"{shown}:{port}" if port else shown)


# The TLS half: a target's client context and its errors.
class TlsSetupError(Exception):
    """A TLS file cannot be used; `key` is the config key that names it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key, self.problem = key, problem


def _why(e: Exception) -> str:
    import ssl

    if isinstance(e, ssl.SSLError):
        return e.reason or e.strerror or str(e)
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return str(e)


def client_context(ca_file: str, verify: bool, cert_file: str, key_file: str) -> ssl.SSLContext:
    """A client context: the system trust store plus `ca_file` (if any), hostname checks unless
    `verify` is false, and a client certificate for mutual TLS (if any). TlsSetupError names
    the key whose file is unusable."""
    import ssl

    ctx = ssl.create_default_context()
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ValueError) as e:
            raise TlsSetupError("ca_file", f"a readable PEM bundle of CA certificates ({_why(e)})") from None
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert_file:
        try:
            ctx.load_cert_chain(cert_file, key_file or None)
        except (OSError, ValueError) as e:
            key = "client_key_file" if key_file and "KEY" in _why(e).upper() else "client_cert_file"
            raise TlsSetupError(key, "a readable PEM certificate and its matching private key "
                                     f"({_why(e)})") from None
    return ctx


def describe(e: ssl.SSLError) -> str:
    """A handshake error in an admin's words: the verification error first, when there is one."""
    import ssl

    if isinstance(e, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {e.verify_message}"
    reason = e.reason or ""
    if "CERTIFICATE_REQUIRED" in reason.upper():
        return "the server requires a client certificate (set client_cert_file and client_key_file)"
    if "UNKNOWN_CA" in reason.upper() or "BAD_CERTIFICATE" in reason.upper():
        return f"the server refused our client certificate ({reason.lower()})"
    if "WRONG_VERSION_NUMBER" in reason.upper() or "RECORD_LAYER" in reason.upper():
        return f"the server does not speak TLS here ({reason.lower()}): is it plain http://?"
    return (reason.lower().replace("_", " ") if reason else "") or str(e)

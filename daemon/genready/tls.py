"""A target's TLS client context, built once, when the config is read (`TargetConfig.tls_context`:
a bad PEM file is then a config error, exit 78), and shared by its probes and the bench client;
and TLS errors in an admin's words."""

from __future__ import annotations

import ssl


class TlsSetupError(Exception):
    """A TLS file cannot be used; `key` is the config key that names it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key, self.problem = key, problem


def _why(e: Exception) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or e.strerror or str(e)
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return str(e)


def client_context(ca_file: str, verify: bool, cert_file: str, key_file: str) -> ssl.SSLContext:
    """A client context: the system trust store plus `ca_file` (if any), hostname checks unless
    `verify` is false, and a client certificate for mutual TLS (if any). TlsSetupError names
    the key whose file is unusable."""
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

"""The CLI's HTTP client (client/client.py) against raw loopback servers, and what `genready wait`
loads: it is the ExecCondition= of every triggered benchmark, so its start-up is kept small."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator

import pytest

from genready.client import client
from genready_dev.harness import PY


class Server:
    """A loopback TCP server that answers each connection with `answer(request bytes)` and closes."""

    def __init__(self, answer: Callable[[bytes], bytes]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[bytes] = []
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data)
                conn.sendall(self.answer(data))


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[bytes], bytes]], Server]]:
    servers: list[Server] = []

    def start(answer: Callable[[bytes], bytes]) -> Server:
        servers.append(Server(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.sock.close()


def http(status: str, body: bytes, *headers: str) -> bytes:
    return (f"HTTP/1.1 {status}\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode() + body


DOC = json.dumps({"target": "t", "state": "ready", "pid": 7}).encode()


@pytest.mark.parametrize("answer", [
    http("200 OK", DOC, f"Content-Length: {len(DOC)}", "Content-Type: application/json"),
    http("200 OK", DOC),  # no length: to the end of the connection
    http("200 OK", b"9\r\n" + DOC[:9] + b"\r\n%x;x=1\r\n" % len(DOC[9:]) + DOC[9:] + b"\r\n0\r\n\r\n",
         "Transfer-Encoding: chunked"),
], ids=["content-length", "until-close", "chunked"])
def test_a_json_answer_is_read_however_it_is_framed(serve: Callable[..., Server], answer: bytes) -> None:
    srv = serve(lambda _: answer)
    assert client.request(srv.base, "/ready/t?wait=0.5") == (200, {"target": "t", "state": "ready", "pid": 7})
    head = srv.requests[0].decode()
    assert head.startswith("GET /ready/t?wait=0.5 HTTP/1.1\r\n") and f"Host: {srv.base[7:]}\r\n" in head


def test_a_refusal_keeps_its_status_and_body(serve: Callable[..., Server]) -> None:
    body = b'{"error": "unknown target x"}'
    srv = serve(lambda _: http("404 Not Found", body, f"Content-Length: {len(body)}"))
    assert client.request(srv.base, "/ready/x") == (404, {"error": "unknown target x"})
    srv = serve(lambda _: http("503 Service Unavailable", b"<html>busy</html>"))
    assert client.request(srv.base, "/ready/x") == (503, {"error": "HTTP 503"})


@pytest.mark.parametrize(("answer", "said"), [
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP answer"),
    (b"", "closed before an HTTP answer"),
    (http("200 OK", b"{}", "Content-Length: 10"), "ended after 2 of 10 bytes"),
    (http("200 OK", b"<html></html>"), "not JSON"),
], ids=["not-http", "closed", "cut", "not-json"])
def test_what_is_not_the_daemon_is_unreachable(serve: Callable[..., Server], answer: bytes, said: str) -> None:
    srv = serve(lambda _: answer)
    with pytest.raises(client.Unreachable, match=said):
        client.request(srv.base, "/ready/t")


def test_an_ipv6_address_in_the_url() -> None:
    try:
        sock = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError as e:
        pytest.skip(f"::1 is not available here: {e}")
    port = sock.getsockname()[1]

    def answer() -> None:
        conn, _ = sock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(http("200 OK", DOC, f"Content-Length: {len(DOC)}"))

    threading.Thread(target=answer, daemon=True).start()
    try:
        assert client.request(f"http://[::1]:{port}", "/ready/t")[0] == 200
    finally:
        sock.close()


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(client.Unreachable, match="refused"):
        client.request(f"http://127.0.0.1:{port}", "/ready/t")


# What the wait path must not load: each was measurable in `genready wait`'s start-up (python
# -X importtime), and none is needed to ask the daemon one question.
HEAVY = ("asyncio", "aiohttp", "pystemd", "http.client", "urllib.request", "email", "ssl", "logging",
         "subprocess", "shutil", "encodings.idna", "unicodedata", "prometheus_client", "genready.serve",
         "genready.rule", "genready.systemd")


@pytest.mark.system
def test_genready_wait_loads_no_heavy_module(serve: Callable[..., Server]) -> None:
    srv = serve(lambda _: http("200 OK", DOC, f"Content-Length: {len(DOC)}"))
    code = ("import sys; from genready.cli import main\n"
            f"try: rc = main(['wait', 't', '--timeout', '0', '--url', {srv.base!r}])\n"
            "finally: print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
            "sys.exit(rc)")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "t: ready pid 7" in r.stdout, r
    loaded = set(r.stderr.split())
    assert "genready.client.client" in loaded  # the list is the wait path's
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], heavy

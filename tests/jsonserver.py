"""A loopback HTTP server whose every GET (and POST, its body read and left) is answered by a function of
its path: the stand-in for genready's /ready where the answer itself is the point of a test (a start never
verified, a target gone, every long-poll slot held), and for a server that refuses every request. In process:
a thread, no child process."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any

Answer = Callable[[str], tuple[int, Any]]  # the request's path -> (status, JSON body)


class JsonServer:
    """Serves `answer` on 127.0.0.1 (`base`) until close(); every path asked is kept in `asked`,
    in order, before it is answered (so `answer` may count it)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.asked: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked.append(self.path)
                code, body = outer.answer(self.path)
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self) -> None:  # answered as a GET of its path, once its body is read
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A 20 ms poll: shutdown() waits for the loop to see it (0.5 s by default, in every test).
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def in_turn(server: JsonServer, answers: list[tuple[int, Any]]) -> tuple[int, Any]:
    """The answer for the request just asked: `answers` in turn, the last one for ever."""
    return answers[min(len(server.asked) - 1, len(answers) - 1)]

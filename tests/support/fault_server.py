"""A real HTTP server on 127.0.0.1 that serves a directory and injects faults, for the data I/O tests.

    with FaultServer(directory) as server:
        server.faults["/a-0.tar"] = ["500", "ok"]   # first GET answers 500, the next ones serve the file
        url = server.url("a-0.tar")

Faults (consumed per GET of the path, in order; the last one stays): ``ok``; an HTTP status (``"404"``,
``"403"``, ``"500"``, ``"503"``); ``reset`` (headers with the full Content-Length, half the body, then a TCP reset);
``stall`` (headers and half the body, then silence until the server stops); ``mute`` (no answer at all, HEAD
included). Faults under ``"*"`` apply to every other path. HEAD requests answer ETag (the content's hash),
Last-Modified and Content-Length. `requests` lists (method, path).
"""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import socket
import struct
import threading
from pathlib import Path


class FaultServer:
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.faults: dict[str, list[str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.stop = threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{name}"

    def gets(self, name: str) -> int:
        return self.requests.count(("GET", "/" + name))

    def __enter__(self) -> "FaultServer":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()  # releases stalled answers
        self.server.shutdown()
        self.server.server_close()

    def _fault(self, path: str, consume: bool = True) -> str:
        queue = self.faults.get(path) or self.faults.get("*") or ["ok"]
        return queue.pop(0) if consume and len(queue) > 1 else queue[0]

    def _handler(self):
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.path = self.path.split("?")[0]  # a signed URL's query string names the same file
                outer.requests.append(("HEAD", self.path))
                if outer._fault(self.path, consume=False) == "mute":
                    outer.stop.wait()
                    return
                file = outer.directory / self.path.lstrip("/")
                if not file.is_file():
                    return self.send_error(404)
                self._headers(file.read_bytes(), file)

            def do_GET(self):
                self.path = self.path.split("?")[0]
                outer.requests.append(("GET", self.path))
                fault = outer._fault(self.path)
                if fault == "mute":
                    outer.stop.wait()
                    return
                if fault.isdigit():
                    return self.send_error(int(fault))
                file = outer.directory / self.path.lstrip("/")
                if not file.is_file():
                    return self.send_error(404)
                data = file.read_bytes()
                self._headers(data, file)
                if fault == "ok":
                    self.wfile.write(data)
                    return
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                if fault == "stall":
                    outer.stop.wait()
                elif fault == "reset":  # SO_LINGER 0: close() sends RST, the reader sees a reset connection
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                else:
                    raise ValueError(f"unknown fault {fault!r}")

            def _headers(self, data: bytes, file: Path):
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest()[:16] + '"')
                self.send_header("Last-Modified", email.utils.formatdate(file.stat().st_mtime, usegmt=True))
                self.end_headers()

        return Handler

"""A fake Hugging Face hub on 127.0.0.1: the endpoints huggingface_hub's snapshot_download
calls (revision info, the file tree, each file's resolve URL), serving one folder per repo."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serves `repos` ({"org/name": folder}) until stop(); `url` is its HF_ENDPOINT."""

    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos
        self.requests: list[str] = []  # "METHOD path", in order
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub.answer(self, body=True)

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo: str) -> dict[str, Path]:
        folder = self.repos[repo]
        return {
            p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()
        }

    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append(f"{h.command} {path}")
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 5:
            repo = "/".join(parts[2:4])
            if repo not in self.repos:
                return self.send(
                    h,
                    404,
                    b'{"error": "Repository not found"}',
                    body,
                    {"X-Error-Code": "RepoNotFound"},
                )
            if parts[4] == "revision":
                info = {
                    "id": repo,
                    "modelId": repo,
                    "sha": COMMIT,
                    "siblings": [{"rfilename": f} for f in self.files(repo)],
                }
                return self.send(h, 200, json.dumps(info).encode(), body)
            if parts[4] == "tree":
                tree = [
                    {"type": "file", "path": name, "size": p.stat().st_size, "oid": _oid(p)}
                    for name, p in self.files(repo).items()
                ]
                return self.send(h, 200, json.dumps(tree).encode(), body)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            file = self.files(repo).get(name) if repo in self.repos else None
            if file is not None:
                data = file.read_bytes()
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_oid(file)}"'}
                return self.send(h, 200, data, body, headers)
            return self.send(h, 404, b"{}", body, {"X-Error-Code": "EntryNotFound"})
        self.send(h, 404, b"{}", body)

    @staticmethod
    def send(
        h: BaseHTTPRequestHandler,
        status: int,
        data: bytes,
        body: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        h.end_headers()
        if body:
            h.wfile.write(data)


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()

from __future__ import annotations

import functools
import hashlib
import http.server
import threading

import pytest


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/www on 127.0.0.1 at a free port (never the network); yields (folder, base URL)."""
    www = tmp_path / "www"
    www.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(www)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty trace cache and no shared traces folder: every trace must be fetched."""
    path = tmp_path / "cache"
    monkeypatch.setenv("WORKBENCH_TRACE_CACHE", str(path))
    monkeypatch.setattr("workbench.traces.store.shared_traces_dir", lambda: None)
    return path


def git_blob_id(data: bytes) -> str:
    """Git's object id of a file with these bytes, written out independently of the store's."""
    return hashlib.sha1(f"blob {len(data)}".encode() + b"\x00" + data).hexdigest()

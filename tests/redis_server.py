"""A real Redis server for the tests (a pytest plugin, see conftest): `redis-server` started on
127.0.0.1 at a free port with its files in a temporary folder, no persistence, stopped at the
end of the test run. Tests that need it skip only where the binary is absent here; CI's .ci/run
installs it, so there they run."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BINARY = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self, folder: Path) -> None:
        assert BINARY is not None
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, port: int | None = None) -> None:
        """Start on `port` (a free one if None); a port taken meanwhile by another process is
        given up for another, up to five times."""
        assert BINARY is not None
        for _ in range(5):
            self.port = port or free_port()
            self.proc = subprocess.Popen(
                [BINARY, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                 str(self.folder), "--save", "", "--appendonly", "no", "--protected-mode", "yes",
                 "--daemonize", "no", "--loglevel", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._ready():
                return
            self.stop()
        raise RuntimeError("redis-server did not start")

    def _ready(self) -> bool:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        try:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
            return False
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    if BINARY is None:
        pytest.skip("redis-server is not installed here (apt-get install redis-server; "
                    ".ci/run installs it)")
    folder = Path(tempfile.mkdtemp(prefix="dslc-redis-"))
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The server's address, emptied before each test (and started again if a test stopped it)."""
    import redis

    if redis_server.proc is None:
        redis_server.start(redis_server.port)
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url

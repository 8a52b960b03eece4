"""Fixtures for the `loupe serve` tests: the real binary on 127.0.0.1, a free port.

Each server is started as a user starts it (`loupe serve --port 0 ...`), its address read
from the "listening on" log line, and `/health` polled until 200. It is stopped with
SIGTERM, and the test fails if it does not exit 0 (graceful shutdown).

Needs: the release binary (LOUPE_BIN, default target/release/loupe; `scripts/test`
builds it) and the model (LOUPE_MODEL, default the cached SmolLM2 Q4_1, fetched by
`scripts/fetch-model`). Without them the tests are skipped with the reason, except under
CI (CI set), where that is a failure.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIR = REPO / "tests" / "golden" / "smollm2-q4_1"


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def loupe_bin() -> Path:
    path = Path(os.environ.get("LOUPE_BIN", REPO / "target" / "release" / "loupe"))
    if not path.exists():
        _missing(f"needs the loupe binary at {path} (cargo build --release -p loupe-cli, or set LOUPE_BIN)")
    return path


def model_path() -> Path:
    env = os.environ.get("LOUPE_MODEL")
    path = Path(env) if env else Path.home() / ".cache" / "loupe" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        _missing(f"needs the model at {path} (scripts/fetch-model, or set LOUPE_MODEL)")
    return path


def qwen_model_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct, whose chat template renders tools (LOUPE_QWEN_MODEL,
    default the cached GGUF; `scripts/fetch-model qwen2.5-coder-0.5b`)."""
    env = os.environ.get("LOUPE_QWEN_MODEL")
    path = Path(env) if env else Path.home() / ".cache" / "loupe" / "models" / "Qwen2.5-Coder-0.5B-Instruct.gguf"
    if not path.exists():
        _missing(f"needs Qwen2.5-Coder-0.5B-Instruct at {path} (scripts/fetch-model qwen2.5-coder-0.5b, or set LOUPE_QWEN_MODEL)")
    return path


def minilm_model_path() -> Path:
    """all-MiniLM-L6-v2, a BERT encoder directory (LOUPE_MINILM_MODEL, default the cached
    directory; `scripts/fetch-model all-minilm-l6-v2`)."""
    env = os.environ.get("LOUPE_MINILM_MODEL")
    path = Path(env) if env else Path.home() / ".cache" / "loupe" / "models" / "all-MiniLM-L6-v2"
    if not (path / "config.json").exists():
        _missing(f"needs all-MiniLM-L6-v2 at {path} (scripts/fetch-model all-minilm-l6-v2, or set LOUPE_MINILM_MODEL)")
    return path


class Server:
    """A running `loupe serve` process."""

    def __init__(self, *args: str, model: Path | None = None, wait_ready: bool = True, timeout: float = 120.0):
        self.args = [str(loupe_bin()), "serve", "--model", str(model or model_path()), "--host", "127.0.0.1", "--port", "0", *args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log: list[str] = []
        self._listening = threading.Event()
        self.base = ""
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._listening.wait(timeout):
            self.kill()
            raise RuntimeError("loupe serve did not report its address:\n" + "".join(self.log))
        if wait_ready:
            self.wait_ready(timeout)

    def _read_log(self):
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if m and not self.base:
                self.base = m.group(1)
                self._listening.set()

    def wait_ready(self, timeout: float = 120.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"loupe serve exited with {self.proc.returncode}:\n" + "".join(self.log))
            try:
                if httpx.get(self.base + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("loupe serve did not become ready:\n" + "".join(self.log))

    def client(self, **kwargs) -> openai.OpenAI:
        kwargs.setdefault("api_key", "unused")
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 300)
        return openai.OpenAI(base_url=self.base + "/v1", **kwargs)

    def async_client(self, **kwargs) -> openai.AsyncOpenAI:
        kwargs.setdefault("api_key", "unused")
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 300)
        return openai.AsyncOpenAI(base_url=self.base + "/v1", **kwargs)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, parsed by prometheus_client, by name and labels."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.base + "/metrics", timeout=10).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server():
    """The default server, shared by a test module; must shut down cleanly."""
    s = Server("--max-context", "2048")
    yield s
    rc = s.stop()
    assert rc == 0, "loupe serve did not exit 0 on SIGTERM:\n" + "".join(s.log)


@pytest.fixture
def start_server():
    """Starts servers with extra flags; each is stopped (and must exit 0) after the test."""
    started: list[Server] = []

    def start(*args: str, **kwargs) -> Server:
        s = Server(*args, **kwargs)
        started.append(s)
        return s

    yield start
    for s in started:
        rc = s.stop()
        assert rc == 0, "loupe serve did not exit 0 on SIGTERM:\n" + "".join(s.log)

"""Helpers for the regenerate tests: real HTTP servers as subprocesses on 127.0.0.1, small datasets."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from eagle3.serving.process import free_port

HERE = Path(__file__).resolve().parent
FAKE_SERVER = HERE / "fake_openai_server.py"


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {timeout} s")


class FakeServer:
    """fake_openai_server.py as a subprocess; restartable on the same port."""

    def __init__(self, log: Path, *args: str, port: int | None = None):
        self.port, self.log, self.args = port or free_port(), log, list(args)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "FakeServer":
        self.proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", str(self.port),
                                      "--log", str(self.log), *self.args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(self.url + "/health", proc=self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def entries(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def conversations(n: int, turns: int = 2) -> list[dict]:
    """n multi-turn conversations in the messages format (distinct texts)."""
    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": "You are terse."}]
        for t in range(turns):
            msgs += [{"role": "user", "content": f"question {i}.{t} what is {i} plus {t}?"},
                     {"role": "assistant", "content": f"original answer {i}.{t}"}]
        out.append({"messages": msgs})
    return out


def write_dataset(tmp_path: Path, records: list, name: str = "chat", fmt: str = "messages",
                  regenerate: bool = True, extra: list[dict] | None = None) -> Path:
    """Write records as JSONL plus a manifest naming them; returns the manifest path."""
    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    entries = [{"name": name, "source": data.name, "format": fmt, "regenerate": regenerate}] + (extra or [])
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump({"datasets": entries}))
    return manifest


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

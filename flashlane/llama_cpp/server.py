"""llama-server on a GGUF, for replies to compare with ours (the parity test) and for
`flashlane bench serve` against it."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

from flashlane.llama_cpp.build import LlamaBuild


class LlamaServer:
    """`with LlamaServer(build, gguf) as s: s.greedy(ids, n)`: a llama-server on a free
    loopback port, stopped (and waited for) on exit."""

    def __init__(
        self,
        build: LlamaBuild,
        gguf: Path,
        context: int = 4096,
        slots: int = 1,
        extra: tuple[str, ...] = (),
        start_timeout: float = 120,
    ):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cmd = [
            str(build.tool("llama-server")),
            "-m",
            str(gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(context),
            "-np",
            str(slots),
            *extra,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"llama-server exited {self.proc.returncode}:\n"
                    + "\n".join(self.proc.stderr.read().splitlines()[-15:])
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"llama-server not up within {start_timeout:g} s")
            time.sleep(0.2)

    def greedy(self, prompt_ids: list[int], num_tokens: int) -> list[int]:
        """The greedy reply's token ids: exactly num_tokens of them (EOS ignored)."""
        body = {
            "prompt": prompt_ids,
            "n_predict": num_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_tokens": True,
            "cache_prompt": False,
        }
        r = httpx.post(f"{self.url}/completion", json=body, timeout=600)
        r.raise_for_status()
        return list(r.json()["tokens"])

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's token ids of `text`, no special tokens added."""
        r = httpx.post(
            f"{self.url}/tokenize", json={"content": text, "add_special": False}, timeout=60
        )
        r.raise_for_status()
        return list(r.json()["tokens"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

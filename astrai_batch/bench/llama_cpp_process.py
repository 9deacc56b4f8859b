"""llama.cpp in a process of its own, so that running it cannot slow the engine down.

Measured on a 2-vCPU Intel Xeon (Sapphire Rapids class, llama-cpp-python 0.3.36 built with
OpenMP, torch 2.13): once llama.cpp had decoded in the bench's process, the engine's next run
of the same prompts took 23.2 s where it had taken 12.7 s just before, although GEMMs timed
in the main thread were unchanged. Whatever llama.cpp's runtime leaves behind (its OpenMP
team beside torch's, its threads' state), a peer must not change the figures of the system
it is compared with, so the bench runs it in a child process (`spawn`: nothing of the
parent's threads or libraries is inherited) and only prompts and results cross the pipe.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from pathlib import Path
from typing import Any

from astrai_batch.bench.llama_cpp_peer import LlamaCppPeer, run_llama_cpp
from astrai_batch.bench.prompts import BenchPrompts
from astrai_batch.bench.runs import SystemRun
from astrai_batch.errors import AstraiBatchError


class LlamaCppProcess:
    """`LlamaCppPeer` in a child process: `run` times one run there (wall and peak RSS are
    the child's), `config()` is the peer's, `close()` ends the child."""

    def __init__(self, path: Path, prompts: BenchPrompts, threads: int) -> None:
        self.path = path
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, path, prompts, threads), daemon=True
        )
        self._process.start()
        child.close()
        self._config = self._reply()

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def run(self, prompts: BenchPrompts, repeat: int | None) -> SystemRun:
        self._conn.send(("run", prompts, repeat))
        return self._reply()

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("close",))
            self._process.join(timeout=30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        self._conn.close()

    def _reply(self) -> Any:
        try:
            status, value = self._conn.recv()
        except EOFError:
            code = self._process.exitcode
            raise AstraiBatchError(f"llama-cpp: its process ended (exit code {code})") from None
        if status == "error":
            raise AstraiBatchError(value)
        return value


def _serve(conn, path: Path, prompts: BenchPrompts, threads: int) -> None:
    try:
        peer = LlamaCppPeer(path, prompts, threads)
    except Exception as exc:  # the parent raises it in the user's terms
        conn.send(("error", str(exc) or type(exc).__name__))
        return
    try:
        conn.send(("ok", peer.config()))
        while True:
            message = conn.recv()
            if message[0] == "close":
                return
            _, run_prompts, repeat = message
            try:
                conn.send(("ok", run_llama_cpp(peer, run_prompts, repeat)))
            except Exception as exc:
                conn.send(("error", str(exc) or type(exc).__name__))
    finally:
        peer.close()

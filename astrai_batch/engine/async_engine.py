"""The anyio-driven engine: requests stream in, results stream out as they finish.

A feeder task pulls requests from the caller's (sync or async) iterable into a bounded
channel; the step loop moves them into the engine core only while its waiting list has room,
so a million-row input never sits in memory. Each model step runs in a worker thread, so
reading, tokenizing and writing on the event loop go on while the model computes.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.loader import LoadedModel
from astrai_batch.engine.types import EngineStats, GenerationRequest, GenerationResult


class Engine:
    """`async with Engine(model, config) as engine: async for r in engine.generate(reqs): ...`"""

    def __init__(self, model: LoadedModel, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.model = model
        self._core: EngineCore | None = None
        self._busy = False

    async def __aenter__(self) -> Engine:
        self._core = await anyio.to_thread.run_sync(EngineCore, self.model, self.config)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self._core = None

    @property
    def core(self) -> EngineCore:
        if self._core is None:
            raise RuntimeError("the engine is not started: use `async with Engine(...)`")
        return self._core

    def stats(self) -> EngineStats:
        return self.core.stats()

    async def generate(
        self, requests: Iterable[GenerationRequest] | AsyncIterable[GenerationRequest]
    ) -> AsyncIterator[GenerationResult]:
        """Yields one result per sample as it finishes (not in request order)."""
        core = self.core
        if self._busy:
            raise RuntimeError("generate() is already running on this engine")
        self._busy = True
        capacity = self.config.waiting_capacity
        send, receive = anyio.create_memory_object_stream[GenerationRequest](capacity)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_feed, requests, send)
                async for result in self._run(core, receive, capacity):
                    yield result
        finally:
            self._busy = False

    async def _run(
        self,
        core: EngineCore,
        receive: MemoryObjectReceiveStream[GenerationRequest],
        capacity: int,
    ) -> AsyncIterator[GenerationResult]:
        exhausted = False
        async with receive:
            while True:
                while not exhausted and core.num_waiting < capacity:
                    if core.num_unfinished == 0:
                        try:
                            request = await receive.receive()  # idle: wait for input
                        except anyio.EndOfStream:
                            exhausted = True
                            break
                    else:
                        try:
                            request = receive.receive_nowait()
                        except anyio.WouldBlock:
                            break
                        except anyio.EndOfStream:
                            exhausted = True
                            break
                    for result in core.add_request(request):
                        yield result
                if core.num_unfinished == 0:
                    if exhausted:
                        return
                    continue
                for result in await anyio.to_thread.run_sync(core.step):
                    yield result


async def _feed(requests, send) -> None:
    async with send:
        if isinstance(requests, AsyncIterable):
            async for request in requests:
                await send.send(request)
        else:
            for request in requests:
                await send.send(request)


def generate_sync(
    model: LoadedModel,
    requests: Iterable[GenerationRequest],
    config: EngineConfig | None = None,
) -> tuple[list[GenerationResult], EngineStats]:
    """Runs a list of requests to completion; results come back in request order."""
    requests = list(requests)

    async def main() -> tuple[list[GenerationResult], EngineStats]:
        async with Engine(model, config) as engine:
            results = [r async for r in engine.generate(requests)]
            return results, engine.stats()

    results, stats = anyio.run(main)
    order = {r.request_id: i for i, r in enumerate(requests)}
    if len(order) != len(requests):
        raise ValueError("request ids must be unique")
    results.sort(key=lambda r: (order[r.request_id], r.sample_index))
    return results, stats

"""The anyio-driven engine: requests stream in, results stream out as they finish.

A feeder task (in the engine's own task group) pulls requests from the caller's (sync or
async) iterable into a bounded channel; the step loop moves them into the engine core only
while its waiting list has room, so a million-row input never sits in memory. Each model step
runs in a worker thread, so reading, tokenizing and writing on the event loop go on while the
model computes.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from astrai_batch.engine.config import EngineConfig
from astrai_batch.engine.core import EngineCore
from astrai_batch.engine.model.loaded import LoadedModel
from astrai_batch.engine.types import EngineStats, GenerationRequest, GenerationResult


class Engine:
    """`async with Engine(model, config) as engine: async for r in engine.generate(reqs): ...`

    The engine owns a task group for the lifetime of the `async with` block; the feeder of
    each `generate` call runs there, not inside the generator, because a generator that yields
    from inside a task group turns an exception raised by its consumer into a GeneratorExit
    wrapped in an exception group. Here the consumer's exception, or the request iterable's,
    reaches the caller as itself.
    """

    def __init__(self, model: LoadedModel, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self.model = model
        self._core: EngineCore | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._busy = False

    async def __aenter__(self) -> Engine:
        self._core = await anyio.to_thread.run_sync(EngineCore, self.model, self.config)
        tasks = anyio.create_task_group()
        await tasks.__aenter__()
        self._tasks = tasks
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        tasks, self._tasks, core, self._core = self._tasks, None, self._core, None
        if tasks is not None:
            # A feeder left behind by a generator the caller abandoned must not keep the exit
            # waiting on its input. The caller's own exception is not handed to the task
            # group, which would wrap it in an exception group; it propagates from here.
            tasks.cancel_scope.cancel()
            await tasks.__aexit__(None, None, None)
        if core is not None:
            core.close()  # no step is in flight any more: stop the mask worker thread
        return None

    @property
    def core(self) -> EngineCore:
        if self._core is None:
            raise RuntimeError("the engine is not started: use `async with Engine(...)`")
        return self._core

    def stats(self) -> EngineStats:
        return self.core.stats()

    @property
    def decode_tokens(self) -> int:
        """Tokens sampled so far, finished requests or not (a counter read: no timers)."""
        return self.core.counters.decode_tokens

    async def generate(
        self, requests: Iterable[GenerationRequest] | AsyncIterable[GenerationRequest]
    ) -> AsyncIterator[GenerationResult]:
        """Yields one result per sample as it finishes (not in request order)."""
        core = self.core
        if self._tasks is None:
            raise RuntimeError("the engine is not started: use `async with Engine(...)`")
        if self._busy:
            raise RuntimeError("generate() is already running on this engine")
        self._busy = True
        capacity = self.config.waiting_capacity
        send, receive = anyio.create_memory_object_stream[GenerationRequest](capacity)
        feeder = _Feeder(requests, send)
        self._tasks.start_soon(feeder.run)
        try:
            async with receive:
                async for result in self._run(core, receive, capacity):
                    yield result
            if feeder.error is not None:
                raise feeder.error
        finally:
            feeder.scope.cancel()
            self._busy = False

    async def _run(
        self,
        core: EngineCore,
        receive: MemoryObjectReceiveStream[GenerationRequest],
        capacity: int,
    ) -> AsyncIterator[GenerationResult]:
        exhausted = False
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


class _Feeder:
    """Pulls the caller's requests into the bounded channel; keeps the iterable's error.

    An error in the iterable ends the channel early and is raised by `generate` after the
    requests already sent have finished, so no result already computed is lost.
    """

    def __init__(
        self,
        requests: Iterable[GenerationRequest] | AsyncIterable[GenerationRequest],
        send: MemoryObjectSendStream[GenerationRequest],
    ) -> None:
        self.requests = requests
        self.send = send
        self.scope = anyio.CancelScope()
        self.error: Exception | None = None

    async def run(self) -> None:
        with self.scope:
            async with self.send:
                try:
                    if isinstance(self.requests, AsyncIterable):
                        async for request in self.requests:
                            await self.send.send(request)
                    else:
                        for request in self.requests:
                            await self.send.send(request)
                except anyio.BrokenResourceError:
                    pass  # the generator stopped reading: nothing left to feed
                except Exception as error:
                    self.error = error


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

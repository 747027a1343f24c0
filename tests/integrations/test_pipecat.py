"""The pipecat processor drives a push session from a real pipecat pipeline, in-process, on loopback."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lipcast.server.app import create_app
from lipcast.server.config import Settings
from lipcast.server.state import RUNTIME
from tests.fakes import speech_pattern, to_int16

pipecat = pytest.importorskip("pipecat")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineWorker  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from lipcast.integrations.pipecat import LipcastAvatar  # noqa: E402

RATE_HZ = 24_000


async def test_pipecat_pipeline_speaks_through_the_avatar_and_interrupts(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings()))
    url = str(client.make_url("")).rstrip("/")
    sessions: list[dict] = []

    async def on_session(info: dict) -> None:
        sessions.append(info)

    avatar = LipcastAvatar(url, sample_rate_hz=RATE_HZ, on_session=on_session)
    worker = PipelineWorker(Pipeline([avatar]), cancel_on_idle_timeout=False)
    speech = to_int16(speech_pattern([("speech", 3.0)], rate_hz=RATE_HZ))
    manager = client.app[RUNTIME].sessions
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame) -> None:  # type: ignore[no-untyped-def]
        started.set()

    async def drive() -> None:
        await asyncio.wait_for(started.wait(), 10)
        await worker.queue_frame(TTSStartedFrame())
        for i in range(0, len(speech), RATE_HZ // 50):  # 20 ms chunks, as TTS services send
            chunk = speech[i : i + RATE_HZ // 50].astype("<i2").tobytes()
            await worker.queue_frame(TTSAudioRawFrame(audio=chunk, sample_rate=RATE_HZ, num_channels=1))
        await worker.queue_frame(TTSStoppedFrame())
        for _ in range(200):
            if sessions and manager.sessions and next(iter(manager.sessions.values())).stream.stats.rendered:
                break
            await asyncio.sleep(0.05)
        session = manager.get(sessions[0]["session_id"])
        await asyncio.sleep(0.5)  # speaking now, most of the utterance still queued
        assert session.buffer.depth_samples > 48_000
        await worker.queue_frame(InterruptionFrame())
        for _ in range(100):
            if session.stream.stats.interrupts:
                break
            await asyncio.sleep(0.02)
        assert session.stream.stats.interrupts == 1 and session.buffer.depth_samples == 0
        assert session.push.received_bytes == len(speech) * 2
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 30)
    assert sessions and sessions[0]["whep_url"].endswith(f"/whep/{sessions[0]['session_id']}")
    assert avatar.sent_bytes == len(speech) * 2 and not avatar.errors
    for _ in range(50):
        if not manager.sessions:
            break
        await asyncio.sleep(0.05)
    assert not manager.sessions  # EndFrame closed the session
    assert np.any(speech)

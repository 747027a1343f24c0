"""A pipecat pipeline whose TTS speaks through a lipcast avatar, with a barge-in. No cloud keys needed.

    lipcast serve &                                   # the avatar server (built-in backend is fine)
    python examples/pipecat_avatar.py http://127.0.0.1:8080

Open the printed viewer link in a browser (or the WHEP URL in OBS) to watch. A stand-in TTS turns each
sentence into speech-like audio at 24 kHz faster than real time, as real TTS services do; the lipcast
processor sits right after it. Midway through the second sentence the script pushes pipecat's
``InterruptionFrame`` (what a user starting to speak causes), and the avatar stops at once.
"""

from __future__ import annotations

import argparse
import asyncio

import numpy as np
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    TextFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from lipcast.integrations.pipecat import LipcastAvatar

RATE_HZ = 24_000
CHUNK = RATE_HZ // 50  # 20 ms frames


class StandInTTS(FrameProcessor):
    """Text in, speech-like audio out: one vowel-ish syllable per word (a harmonic tone with formants)."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = np.random.default_rng(0)

    def syllable(self, seconds: float) -> np.ndarray:
        t = np.arange(int(seconds * RATE_HZ)) / RATE_HZ
        f0 = self.rng.uniform(100, 200)
        tone = sum(np.sin(2 * np.pi * k * f0 * t) / k for k in range(1, 12))
        envelope = np.minimum(1.0, np.minimum(t, t[-1] - t) / 0.02)
        return 0.25 * envelope * tone / 3.0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, TextFrame):
            await self.push_frame(frame, direction)
            return
        audio = np.concatenate([self.syllable(0.22) for _ in frame.text.split()] + [np.zeros(RATE_HZ // 4)])
        pcm = np.round(audio * 32767).astype("<i2").tobytes()
        await self.push_frame(TTSStartedFrame())
        for i in range(0, len(pcm), CHUNK * 2):
            await self.push_frame(TTSAudioRawFrame(pcm[i : i + CHUNK * 2], RATE_HZ, 1))
        await self.push_frame(TTSStoppedFrame())


async def main(url: str, token: str | None) -> None:
    async def show(session: dict) -> None:
        print(f"watch the avatar: {session['viewer_url']}\n  (WHEP for OBS: {session['whep_url']})")

    avatar = LipcastAvatar(url, sample_rate_hz=RATE_HZ, token=token, forward_audio=False, on_session=show)
    worker = PipelineWorker(Pipeline([StandInTTS(), avatar]), cancel_on_idle_timeout=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    async def converse() -> None:
        await started.wait()
        await asyncio.sleep(3.0)  # time to open the viewer
        await worker.queue_frame(TextFrame("hello there I am a lipcast avatar driven by a pipecat pipeline"))
        await asyncio.sleep(5.0)
        await worker.queue_frame(TextFrame("this sentence is long and will be cut short by the user " * 3))
        await asyncio.sleep(2.5)
        print("the user barges in: InterruptionFrame")
        await worker.queue_frame(InterruptionFrame())
        await asyncio.sleep(1.5)
        await worker.queue_frame(TextFrame("sorry go ahead"))
        await asyncio.sleep(3.0)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), converse())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url", nargs="?", default="http://127.0.0.1:8080")
    parser.add_argument("--token", help="the server's bearer token, if it has one")
    args = parser.parse_args()
    asyncio.run(main(args.url, args.token))

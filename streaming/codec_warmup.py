"""One pass through a call's media code before a process takes its first call.

The first call of a fresh process paid for one-time work on its event loop: codec libraries opening their
first contexts (Opus, libvpx, libswresample's first graph), modules imported on first use (the DTLS
certificate's crypto, numpy's FFT), first allocations. On the H200 box that cost the first call a 134 ms
event-loop stall in the Opus encoder's resampler 1.4 s in (``lipcast.streaming.loop_stalls``); inbound audio
waited in the socket meanwhile and the jitter buffer, taking it for network jitter, held ~40 ms more for the
next 10 s. :func:`warm_media_path` runs the same steps once, off the loop, at startup:

* a DTLS certificate (key generation and its serialisation, as every call's peer connection does);
* Opus: aiortc's encoder on the outbound track's frames (:func:`lipcast.streaming.tracks.stereo_audio_frame`),
  its decoder, and the inbound mono resampler;
* VP8: the picture's conversion (:meth:`lipcast.streaming.frames.ComposedFrame.video_frame`) and lipcast's
  encoder (a key frame and a delta frame) at the avatar's size;
* the speech detector and the 48 -> 16 kHz decimator.
"""

from __future__ import annotations

import importlib
import logging
import time

import numpy as np
from aiortc import RTCCertificate
from aiortc.codecs import get_decoder, get_encoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from av import AudioFrame, AudioResampler
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ, VIDEO_PTS_PER_FRAME
from lipcast.streaming.encoders import Vp8Encoder, Vp8Settings
from lipcast.streaming.frames import ComposedFrame
from lipcast.streaming.resample import Decimator
from lipcast.streaming.tracks import stereo_audio_frame
from lipcast.streaming.vad import SpeechDetector

logger = logging.getLogger(__name__)

OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=MEDIA_SAMPLE_RATE_HZ, channels=2)
AUDIO_FRAME_SAMPLES = MEDIA_SAMPLE_RATE_HZ // 50  # 20 ms, as the outbound track sends


def _audio_frame(index: int) -> AudioFrame:
    tone = (3000 * np.sin(np.arange(AUDIO_FRAME_SAMPLES) * 0.05)).astype(np.int16)
    return stereo_audio_frame(tone, index * AUDIO_FRAME_SAMPLES)


def _warm_audio() -> int:
    """Encode, decode, resample and detect three frames; returns the 48 kHz mono samples that came out."""
    encoder, decoder = get_encoder(OPUS), get_decoder(OPUS)
    resampler = AudioResampler(format="s16", layout="mono", rate=MEDIA_SAMPLE_RATE_HZ)
    detector, decimator = SpeechDetector(), Decimator()
    out = 0
    for index in range(3):
        packets, timestamp = encoder.encode(_audio_frame(index))
        for packet in packets:
            for decoded in decoder.decode(JitterFrame(data=packet, timestamp=timestamp)):
                assert isinstance(decoded, AudioFrame)
                for mono in resampler.resample(decoded):
                    samples = mono.to_ndarray().reshape(-1).astype(np.int16)
                    out += len(samples)
                    detector.is_speech(samples[: detector.block_samples])
                    decimator.process(samples.astype(np.float32)[: len(samples) // 3 * 3])
    np.fft.rfft(np.zeros(512, np.float32))  # imported on first use by the features
    importlib.import_module("numpy.ma")  # imported during a worker's first call on the H200 (57 ms there)
    return out


def _warm_video(width: int, height: int, settings: Vp8Settings | None) -> None:
    encoder = Vp8Encoder(settings)
    rgb = np.zeros((height, width, 3), np.uint8)
    for index in range(2):
        rgb[:, :, 1] = 40 * index
        composed = ComposedFrame.of_image(index, rgb.copy(), index * VIDEO_PTS_PER_FRAME)
        frame = composed.video_frame()  # as a call's picture is converted for its encoders
        encoder.encode(frame, force_keyframe=index == 0)


def warm_media_path(width: int = 320, height: int = 320, vp8: Vp8Settings | None = None) -> float:
    """Run a call's one-time media work now (blocking; call it off the event loop). Returns seconds taken."""
    start = time.perf_counter()
    # The key and its serialisation (aiortc writes it into each call's TLS context).
    key = RTCCertificate.generateCertificate()._key
    key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    if not _warm_audio():
        raise RuntimeError("the Opus round trip at startup returned no audio")
    _warm_video(width, height, vp8)
    elapsed_s = time.perf_counter() - start
    logger.info("media path warmed (DTLS key, Opus, VP8 %dx%d) in %.0f ms", width, height, elapsed_s * 1000)
    return elapsed_s

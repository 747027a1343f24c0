"""The media's sample rates and frame timing, declared once for every layer (server, streaming, pipeline).

Video runs at :data:`FPS`; every video frame carries its :data:`FRAME_MS` of audio. WebRTC audio (Opus, in and
out) is 48 kHz; the lip-sync featurizers analyse 16 kHz.
"""

from __future__ import annotations

MEDIA_SAMPLE_RATE_HZ = 48_000  # audio in and out: what Opus decodes to and encodes from
FEATURE_SAMPLE_RATE_HZ = 16_000  # the featurizers' input (and Wav2Lip's mel rate)
FPS = 25  # the output frame rate: the lip-sync models' own
FRAME_MS = 1000.0 / FPS  # 40 ms of audio per video frame
MEDIA_SAMPLES_PER_FRAME = MEDIA_SAMPLE_RATE_HZ // FPS  # 1920
FEATURE_SAMPLES_PER_FRAME = FEATURE_SAMPLE_RATE_HZ // FPS  # 640
OPUS_PACKET_SAMPLES = MEDIA_SAMPLE_RATE_HZ // 50  # 960: the 20 ms packets a browser's Opus sender uses
VIDEO_CLOCK_HZ = 90_000  # RTP's video clock
VIDEO_PTS_PER_FRAME = VIDEO_CLOCK_HZ // FPS  # 3600

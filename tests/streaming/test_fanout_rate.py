"""The viewers' shared encoder follows its slowest viewer's receiver estimate, within its configured
target."""

from __future__ import annotations

import av
import numpy as np

from lipcast.streaming.encoders import MIN_BITRATE_BPS
from lipcast.streaming.fanout import RATE_CHECK_INTERVAL_S, EncodedFanout, Vp8PacketEncoder
from tests.streaming.test_avatar_stream import ManualRenderer, make_stream


def frame(pts: int) -> av.VideoFrame:
    out = av.VideoFrame.from_ndarray(np.full((64, 64, 3), pts % 255, np.uint8), format="rgb24")
    out.pts = pts
    return out


def test_the_encoder_moves_to_a_lower_estimate_and_back_with_hysteresis() -> None:
    encoder = Vp8PacketEncoder(1_500_000)
    encoder.encode(frame(0))
    assert encoder.target_bps == 1_500_000 and encoder.codec.bit_rate == 1_500_000
    encoder.follow(300_000)
    packet, keyframe = encoder.encode(frame(1))
    assert encoder.codec.bit_rate == 300_000 and keyframe  # reopened: the viewers get a keyframe
    opened = encoder.codec
    encoder.follow(290_000)  # within 10 %: stays
    encoder.encode(frame(2))
    assert encoder.codec is opened and encoder.target_bps == 300_000
    encoder.follow(10_000)
    assert encoder.target_bps == MIN_BITRATE_BPS
    encoder.follow(5_000_000)  # never above the configured target
    assert encoder.target_bps == 1_500_000
    encoder.follow(None)  # no viewer sent an estimate
    assert encoder.target_bps == 1_500_000


def test_the_fanout_takes_the_lowest_estimate_of_its_viewers_once_a_second() -> None:
    stream, _, _ = make_stream(ManualRenderer())
    now = [0.0]
    fanout = EncodedFanout(stream, video_bitrate_bps=1_500_000, monotonic=lambda: now[0])
    fast, slow, silent = fanout.subscribe(), fanout.subscribe(), fanout.subscribe()
    fast.estimate_bps, silent.estimate_bps = lambda: 2_000_000, lambda: None
    estimate = [400_000]
    slow.estimate_bps = lambda: estimate[0]
    fanout._follow_viewers()
    assert fanout.stats.video_target_bps == 400_000
    estimate[0] = 200_000
    fanout._follow_viewers()  # not a second later yet
    assert fanout.stats.video_target_bps == 400_000
    now[0] += RATE_CHECK_INTERVAL_S
    fanout._follow_viewers()
    assert fanout.stats.video_target_bps == 200_000
    fanout.unsubscribe(slow)  # the slow viewer left: back to the configured target
    now[0] += RATE_CHECK_INTERVAL_S
    fanout._follow_viewers()
    assert fanout.stats.video_target_bps == 1_500_000

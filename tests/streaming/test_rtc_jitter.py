"""The receive jitter buffers that replace aiortc's: audio packets at once, video frames on the marker bit."""

from __future__ import annotations

from aiortc.rtp import RtpPacket

from lipcast.streaming.rtc import MarkerJitterBuffer, PacketJitterBuffer


def packet(seq: int, timestamp: int, data: bytes, marker: int = 0) -> RtpPacket:
    p = RtpPacket(payload_type=96, marker=marker, sequence_number=seq, timestamp=timestamp)
    p._data = data  # type: ignore[attr-defined]  # what aiortc's receiver sets after depayloading
    return p


def test_audio_packets_leave_at_once_and_in_order() -> None:
    jb = PacketJitterBuffer()
    _, frame = jb.add(packet(100, 0, b"a"))
    assert frame is not None and frame.data == b"a"  # aiortc's own waits for the next packet
    _, frame = jb.add(packet(102, 1920, b"c"))  # 101 is late: 102 waits behind the gap
    assert frame is None
    _, frame = jb.add(packet(101, 960, b"b"))
    assert frame is not None and frame.data == b"b"
    _, frame = jb.add(packet(103, 2880, b"d"))
    assert frame is not None and frame.data == b"c"  # one frame per packet, in order: nothing lost
    _, frame = jb.add(packet(104, 3840, b"e"))
    assert frame is not None and frame.data == b"d"


def test_video_frames_leave_on_their_marker_packet() -> None:
    jb = MarkerJitterBuffer()
    assert jb.add(packet(1, 3600, b"x1"))[1] is None
    _, frame = jb.add(packet(2, 3600, b"x2", marker=1))
    assert frame is not None and frame.data == b"x1x2" and frame.timestamp == 3600
    assert jb.add(packet(4, 7200, b"y2", marker=1))[1] is None  # its first packet is missing
    _, frame = jb.add(packet(3, 7200, b"y1"))
    assert frame is not None and frame.data == b"y1y2"
    assert jb.add(packet(5, 10800, b"z1"))[1] is None  # z's marker packet is lost ...
    _, frame = jb.add(packet(7, 14400, b"w1", marker=1))
    assert frame is None  # (6 missing too)
    _, frame = jb.add(packet(6, 10800, b"z2"))
    assert frame is not None and frame.data == b"z1z2"  # ... released when the next frame starts


def test_a_frame_given_up_takes_the_frames_queued_behind_it_along(monkeypatch) -> None:
    import lipcast.streaming.rtc as rtc

    now = [100.0]
    monkeypatch.setattr(rtc.time, "monotonic", lambda: now[0])
    jb = MarkerJitterBuffer()
    assert jb.add(packet(1, 3600, b"a1"))[1] is None  # a2 (seq 2) never comes
    for n in range(1, 5):  # frames 2..5 complete behind it: they predict from the broken one
        now[0] += 0.040
        assert jb.add(packet(2 * n + 1, 3600 * (n + 1), b"x"))[1] is None
        assert jb.add(packet(2 * n + 2, 3600 * (n + 1), b"y", marker=1))[1] is None
    now[0] += 0.050  # 210 ms since the stall began: give up
    pli, frame = jb.add(packet(11, 3600 * 6, b"f1"))
    assert pli and frame is None
    pli, frame = jb.add(packet(12, 3600 * 6, b"f2", marker=1))
    assert frame is not None and frame.data == b"f1f2"  # the newest frame at once, not five frames late

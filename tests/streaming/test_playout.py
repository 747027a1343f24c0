"""The inbound packet stage against packet timelines: order, the loss deadline, concealment, lateness."""

from __future__ import annotations

import numpy as np
import pytest

from lipcast.streaming.opus import OpusDecoder, has_lbrr, libopus_available
from lipcast.streaming.playout import MAX_WAIT_MS, MIN_WAIT_MS, PacketPlayout, Released

PACKET = 960  # 20 ms at 48 kHz


class FakeDecoder(OpusDecoder):
    """Decodes a packet to 960 copies of its first byte; PLC gives -1s, FEC -2s (no libopus needed)."""

    def __init__(self) -> None:
        self.backend = "fake"

    def decode(self, packet: bytes) -> np.ndarray:
        return np.full(PACKET, packet[0], np.int16)

    def conceal(self, samples: int) -> np.ndarray:
        return np.full(samples, -1, np.int16)

    def recover(self, next_packet: bytes, samples: int) -> np.ndarray:
        return np.full(samples, -2, np.int16)


def playout(wait_ms: float = 30.0) -> tuple[PacketPlayout, list[tuple[int, float]]]:
    late: list[tuple[int, float]] = []
    p = PacketPlayout(FakeDecoder(), wait_ms_for=lambda: wait_ms, on_late=lambda ts, t: late.append((ts, t)))
    return p, late


def packet(n: int) -> tuple[int, int, bytes]:
    """Packet n: sequence, RTP timestamp, a payload whose first byte says n (a SILK TOC, no FEC)."""
    return (65530 + n) % 65536, (1 << 32) - 3 * PACKET + n * PACKET, bytes([n % 100 + 1, 0x00])


def values(released: list[Released]) -> list[int]:
    return [int(r.samples[0]) for r in released]


def test_in_order_packets_are_released_as_they_arrive_across_the_wrap() -> None:
    p, _ = playout()
    out = [values(p.push(*packet(n), arrived_s=n * 0.02)) for n in range(10)]  # sequence and RTP wrap
    assert out == [[n + 1] for n in range(10)]
    assert p.stats.received == 10 and p.stats.lost == 0 and p.deadline_s() is None


def test_a_reordered_packet_within_the_wait_is_played_in_order() -> None:
    p, _ = playout(wait_ms=30)
    assert values(p.push(*packet(0), arrived_s=0.00)) == [1]
    assert values(p.push(*packet(2), arrived_s=0.04)) == []  # 1 is missing: wait
    assert p.deadline_s() == pytest.approx(0.07)
    assert values(p.push(*packet(1), arrived_s=0.05)) == [2, 3]
    assert p.stats.reordered == 1 and p.stats.lost == 0


def test_a_lost_packet_is_concealed_at_the_deadline_and_a_late_one_dropped_but_reported() -> None:
    p, late = playout(wait_ms=30)
    p.push(*packet(0), arrived_s=0.00)
    p.push(*packet(2), arrived_s=0.04)
    assert p.release(0.069) == []
    out = p.release(0.070)
    assert values(out) == [-1, 3] and [r.kind for r in out] == ["plc", "decoded"]
    assert out[0].arrived_s is None and len(out[0].samples) == PACKET  # the RTP timestamps' hole, exactly
    assert values(p.push(*packet(1), arrived_s=0.08)) == []
    assert p.stats.lost == 1 and p.stats.late == 1 and p.stats.concealed_samples == PACKET
    assert late == [(packet(1)[1], 0.08)]


def test_the_wait_follows_the_jitter_estimate_within_its_bounds() -> None:
    for wanted, used in ((0.0, MIN_WAIT_MS), (45.0, 45.0), (1000.0, MAX_WAIT_MS)):
        p, _ = playout(wait_ms=wanted)
        p.push(*packet(0), arrived_s=0.0)
        p.push(*packet(2), arrived_s=0.1)
        assert p.deadline_s() == pytest.approx(0.1 + used / 1000.0)


def test_a_burst_is_concealed_whole_and_the_packet_before_the_first_present_one_comes_from_fec() -> None:
    p, _ = playout(wait_ms=20)
    p.push(*packet(0), arrived_s=0.0)
    seq, ts, _ = packet(5)
    fec_payload = bytes([0x78, 0xFF])  # hybrid (config 15), code 0; first SILK bits: VAD 1, LBRR 1
    assert has_lbrr(fec_payload)
    p.push(seq, ts, fec_payload, arrived_s=0.1)
    out = p.release(0.2)
    assert [r.kind for r in out] == ["plc", "plc", "plc", "fec", "decoded"]
    assert p.stats.lost == 4 and p.stats.fec_recovered == 1


def test_a_shortfall_conceals_a_known_gap_at_once_and_an_unknown_one_while_the_caller_talks() -> None:
    p, _ = playout(wait_ms=100)
    p.push(*packet(0), arrived_s=0.00)
    p.push(*packet(2), arrived_s=0.04)
    # the buffer is short now: no waiting for the deadline (0.14)
    assert values(p.release(0.045, need_samples=PACKET)) == [-1, 3]
    # nothing is waiting, but packets came a moment ago: the next packet's slot is concealed ahead
    assert values(p.release(0.06, need_samples=100)) == [-1]
    assert values(p.push(*packet(3), arrived_s=0.07)) == []  # its slot was filled: late
    assert values(p.push(*packet(4), arrived_s=0.08)) == [5]
    # a caller that went quiet long ago is not concealed (the buffer runs dry, as before)
    assert p.release(1.0, need_samples=PACKET) == []
    assert p.stats.lost == 2 and p.stats.late == 1


def test_duplicates_are_dropped_and_a_new_stream_starts_over() -> None:
    p, _ = playout()
    p.push(*packet(0), arrived_s=0.0)
    assert p.push(*packet(0), arrived_s=0.01) == []
    assert p.stats.duplicates == 0 and p.stats.late == 1  # already played: it is late, not a duplicate
    p.push(*packet(2), arrived_s=0.02)
    assert p.push(*packet(2), arrived_s=0.03) == [] and p.stats.duplicates == 1
    out = p.push(12345, 7, bytes([9, 0]), arrived_s=0.05)  # the sender restarted
    assert values(out) == [9]


@pytest.mark.skipif(not libopus_available(), reason="needs the system's libopus (Debian libopus0)")
def test_libopus_decodes_conceals_and_recovers_and_the_lbrr_flag_matches_its_encoder() -> None:
    import opuslib_next

    t = np.arange(PACKET * 30) / 48000
    voice = (np.sin(2 * np.pi * 180 * t) * 6000 * (1.2 + np.sin(2 * np.pi * 2 * t))).astype(np.int16)
    flags = {}
    for fec in (False, True):
        encoder = opuslib_next.Encoder(48000, 1, "voip")
        encoder.inband_fec = int(fec)
        encoder.packet_loss_perc = 20
        encoder.bitrate = 32000
        packets = [encoder.encode(voice[i * PACKET : (i + 1) * PACKET].tobytes(), PACKET) for i in range(30)]
        flags[fec] = [has_lbrr(pk) for pk in packets]
    assert not any(flags[False]) and sum(flags[True]) >= 5
    decoder = OpusDecoder()
    assert decoder.backend == "libopus"
    assert decoder.decode(packets[0]).shape == (PACKET,)
    concealed = decoder.conceal(PACKET)
    assert concealed.shape == (PACKET,) and np.abs(concealed).mean() > 0  # PLC continues the voice
    with_fec = next(i for i, f in enumerate(flags[True]) if f and i > 2)
    assert decoder.recover(packets[with_fec], PACKET).shape == (PACKET,)

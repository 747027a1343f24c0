"""Inbound audio packets -> in-order audio, in time: reordering, a deadline for a missing packet, concealment.

aiortc's receiver would hold every packet behind a missing one until it arrives or its 16-packet ring
overflows (320 ms): one lost packet stalled the call, and the adaptive buffer read the stall as jitter. A
real-time receiver (WebRTC's NetEQ is the reference) waits for a missing packet only as long as the jitter
it measures says is worth it, then conceals it and moves on. :class:`PacketPlayout` is that policy, with no
I/O and its clock passed in (unit-tested against recorded packet timelines):

* Packets are put in sequence order (16-bit sequence numbers extended across wrap-around). The head of the
  sequence is released as soon as it is there.
* When a later packet is there but the head is not, the head is waited for until ``wait_ms`` after the
  first later packet arrived; ``wait_ms`` follows the jitter estimate (``wait_ms_for()`` of the caller,
  kept between :data:`MIN_WAIT_MS` and :data:`MAX_WAIT_MS`). Past that deadline every missing packet up to
  the first present one is concealed: the one just before it from that packet's in-band FEC data when it
  carries some, the others by libopus's PLC (:class:`lipcast.streaming.opus.OpusDecoder`), as many samples
  as the RTP timestamps say are missing, so the audio's timeline stays the sender's.
* When the media clock finds the buffer short (:meth:`PacketPlayout.release` with ``need_samples``), it
  does not wait for the deadline: a known gap is concealed at once, and while the caller is talking (a
  packet arrived in the last :data:`ACTIVE_STREAM_MS`) the missing audio is concealed even before the next
  packet says it is missing (a burst of losses, or a packet stuck in the network), whole packets at a time.
  The stream's timeline stays the sender's, so the buffer never runs dry for loss, and its adaptive target
  follows the network's jitter only. A single packet concealed so, when the packet after it comes carrying
  in-band FEC, could have been rebuilt had that packet been there in time (for a burst, its last packet):
  ``on_fec_missed`` tells the buffer, which then keeps one packet more while the stream stays lossy
  (:meth:`lipcast.streaming.audio_buffer.InputAudioBuffer.observe_fec_missed`).
* A packet that arrives after its slot was concealed is dropped (*late*) but its arrival is reported
  (``on_late``): lateness is jitter, and the buffer's target must see it. The buffer then holds the stream
  back a tick (:meth:`PacketPlayout.stretch`: concealment that takes no slot) while it is below its target,
  so the packets behind arrive in time: without that, a network that grew later mid-call would leave every
  packet late. A duplicate is dropped. Audio is never reordered.

Counters: received, lost (concealed packets), concealed samples, FEC-recovered packets, late, reordered
(arrived after a packet sent later, but in time), duplicates, stretched samples (of the concealed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from lipcast.pipeline.timing import MEDIA_SAMPLE_RATE_HZ
from lipcast.streaming.opus import OpusDecoder, has_lbrr

Int16Array = npt.NDArray[np.int16]
MIN_WAIT_MS = 10.0  # a missing packet is always waited for this long (a reordering by one packet)
MAX_WAIT_MS = 120.0  # and never longer than this, whatever the jitter estimate says
MAX_PLC_MS = 200.0  # a longer run of lost packets goes on as silence (libopus's PLC fades out anyway)
MAX_FILL_MS = 2000.0  # a longer hole (an outage) is skipped, not filled: the timeline starts over
ACTIVE_STREAM_MS = 200.0  # a packet this recent means the caller is sending: a shortfall is loss, conceal it
DEFAULT_PACKET_SAMPLES = MEDIA_SAMPLE_RATE_HZ // 50  # 20 ms, until a packet says otherwise
SEQUENCE_RESET = 3000  # a jump this far (or a step back this far) is a new stream, not loss


@dataclass
class PlayoutStats:
    received: int = 0
    lost: int = 0  # packets given up on and concealed
    concealed_samples: int = 0
    fec_recovered: int = 0  # of the lost, rebuilt from the next packet's in-band FEC
    fec_missed: int = 0  # runs of lost packets concealed before the next packet, carrying FEC, came
    late: int = 0  # arrived after their slot was concealed (dropped)
    reordered: int = 0  # arrived after a packet sent later, in time to be played
    duplicates: int = 0
    stretched_samples: int = 0  # concealment that held the stream back (:meth:`PacketPlayout.stretch`)
    skipped_samples: int = 0  # holes longer than MAX_FILL_MS, left out

    def to_json(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass(frozen=True)
class Released:
    """A stretch of audio in stream order. ``arrived_s``: when its packet arrived (None: concealed)."""

    samples: Int16Array
    arrived_s: float | None
    kind: str  # "decoded", "fec", "plc", "silence" (a long run of losses)
    timestamp: int | None = None  # RTP timestamp of its first sample, when known


@dataclass
class _Packet:
    timestamp: int  # RTP, 48 kHz
    payload: bytes
    arrived_s: float


@dataclass
class PacketPlayout:
    """One inbound Opus stream's packet stage (see the module doc)."""

    decoder: OpusDecoder
    wait_ms_for: Callable[[], float] = lambda: MIN_WAIT_MS
    on_late: Callable[[int, float], None] | None = None  # (its RTP timestamp, when it arrived)
    # A packet was concealed by PLC before the one after it came, on a stream that carries in-band FEC: one
    # packet more of buffer would have rebuilt it (the buffer deepens: InputAudioBuffer.observe_fec_missed).
    on_fec_missed: Callable[[], None] | None = None
    stats: PlayoutStats = field(default_factory=PlayoutStats)

    def __post_init__(self) -> None:
        self._waiting: dict[int, _Packet] = {}
        self._next: int | None = None  # the extended sequence number of the next packet to play
        self._highest: int | None = None
        self._next_timestamp: int | None = None  # where the next audio starts on the RTP clock
        self._gap_since_s: float | None = None  # when the first packet behind the missing head arrived
        self._last_arrival_s: float | None = None
        self._packet_samples = DEFAULT_PACKET_SAMPLES
        # The run of packets last concealed ahead, (first sequence number, count): when the packet after it
        # comes carrying FEC, FEC would have rebuilt the run's last packet had it been there.
        self._concealed_ahead: tuple[int, int] | None = None

    def _extend(self, sequence: int) -> int:
        if self._highest is None:
            return sequence
        highest = self._highest
        base = highest & ~0xFFFF
        candidates = (base - 0x10000 + sequence, base + sequence, base + 0x10000 + sequence)
        return min(candidates, key=lambda c: abs(c - highest))

    def push(self, sequence: int, timestamp: int, payload: bytes, arrived_s: float) -> list[Released]:
        """A packet arrived; returns what may be played now (in order)."""
        seq = self._extend(sequence)
        if self._next is not None and abs(seq - self._next) > SEQUENCE_RESET:
            self._reset()  # a new stream (the sender restarted): start over at this packet
        self.stats.received += 1
        self._last_arrival_s = arrived_s
        if self._next is None:
            self._next = seq
        if seq < self._next:
            self.stats.late += 1
            if self.on_late is not None:
                self.on_late(timestamp, arrived_s)
            return []
        if seq in self._waiting:
            self.stats.duplicates += 1
            return []
        if self._concealed_ahead is not None and seq >= sum(self._concealed_ahead):
            start, count = self._concealed_ahead
            self._concealed_ahead = None
            if seq == start + count and has_lbrr(payload):
                self.stats.fec_missed += 1
                if self.on_fec_missed is not None:
                    self.on_fec_missed()
        if self._highest is not None and seq < self._highest:
            self.stats.reordered += 1
        self._highest = seq if self._highest is None else max(self._highest, seq)
        self._waiting[seq] = _Packet(timestamp, payload, arrived_s)
        if seq != self._next and self._gap_since_s is None:
            self._gap_since_s = arrived_s
        return self.release(arrived_s)

    def deadline_s(self) -> float | None:
        """When :meth:`release` gives up on the missing head (None: nothing is waiting on it)."""
        if self._gap_since_s is None:
            return None
        wait_ms = min(MAX_WAIT_MS, max(MIN_WAIT_MS, self.wait_ms_for()))
        return self._gap_since_s + wait_ms / 1000.0

    def release(self, now_s: float, need_samples: int = 0) -> list[Released]:
        """Everything playable at ``now_s``: the head run, and past the deadline the concealed gap too.

        ``need_samples``: the buffer is this short of the tick being played now; a gap is concealed without
        waiting, and with nothing to wait for, while the stream is active, the shortfall is concealed."""
        out: list[Released] = []
        while True:
            out.extend(self._play_head_run())
            short = need_samples - sum(len(r.samples) for r in out)
            deadline = self.deadline_s()
            if deadline is not None and (now_s >= deadline or short > 0):
                out.extend(self._conceal_gap())
                continue
            if short > 0 and deadline is None and self._active(now_s):
                out.extend(self._conceal_ahead(short))
            return out

    def stretch(self, samples: int) -> Int16Array:
        """``samples`` of concealment that continue the audio without taking a packet's slot: the buffer
        holds the stream back while the network has grown later, so the packets now on their way are in time.
        """
        out = self.decoder.conceal(samples)
        self.stats.concealed_samples += len(out)
        self.stats.stretched_samples += len(out)
        return out

    def _active(self, now_s: float) -> bool:
        last = self._last_arrival_s
        return self._next is not None and last is not None and now_s - last < ACTIVE_STREAM_MS / 1000.0

    def _conceal_ahead(self, short: int) -> list[Released]:
        """Conceal the next whole packets that are not there yet (a packet arriving for them is late)."""
        assert self._next is not None
        packets = -(-short // self._packet_samples)
        out = []
        for _ in range(packets):
            samples = self.decoder.conceal(self._packet_samples)
            self.stats.concealed_samples += len(samples)
            out.append(Released(samples, None, "plc"))
        self.stats.lost += packets
        start, count = self._concealed_ahead or (self._next, 0)
        run_goes_on = start + count == self._next
        self._concealed_ahead = (start, count + packets) if run_goes_on else (self._next, packets)
        self._next += packets
        if self._next_timestamp is not None:
            self._next_timestamp += packets * self._packet_samples
        return out

    def _play_head_run(self) -> list[Released]:
        out = []
        assert self._next is not None or not self._waiting
        while self._next is not None and self._next in self._waiting:
            packet = self._waiting.pop(self._next)
            samples = self.decoder.decode(packet.payload)
            out.append(Released(samples, packet.arrived_s, "decoded", packet.timestamp))
            if len(samples):
                self._packet_samples = len(samples)
            self._next_timestamp = packet.timestamp + len(samples)
            self._next += 1
        self._gap_since_s = min(p.arrived_s for p in self._waiting.values()) if self._waiting else None
        return out

    def _conceal_gap(self) -> list[Released]:
        """Conceal every missing packet before the first present one."""
        assert self._next is not None and self._waiting
        first = min(self._waiting)
        present = self._waiting[first]
        missing_packets = first - self._next
        if self._next_timestamp is None:
            hole = missing_packets * self._packet_samples
        else:
            hole = (present.timestamp - self._next_timestamp) % (1 << 32)
            hole = hole if hole < 1 << 31 else 0  # behind: nothing to fill
        out: list[Released] = []
        self.stats.lost += missing_packets
        if hole > MAX_FILL_MS * MEDIA_SAMPLE_RATE_HZ / 1000:
            self.stats.skipped_samples += hole
        elif hole:
            per_packet = hole // max(1, missing_packets)
            plc_left = int(MAX_PLC_MS * MEDIA_SAMPLE_RATE_HZ / 1000)
            for k in range(missing_packets):
                count = per_packet if k < missing_packets - 1 else hole - per_packet * (missing_packets - 1)
                if k == missing_packets - 1 and has_lbrr(present.payload):
                    samples, kind = self.decoder.recover(present.payload, count), "fec"
                    self.stats.fec_recovered += 1
                elif plc_left > 0:
                    samples, kind = self.decoder.conceal(count), "plc"
                    plc_left -= len(samples)
                else:
                    samples, kind = np.zeros(count, np.int16), "silence"
                self.stats.concealed_samples += len(samples)
                out.append(Released(samples, None, kind))
        self._next = first
        self._next_timestamp = present.timestamp
        self._gap_since_s = None
        return out

    def _reset(self) -> None:
        self._waiting.clear()
        self._next = self._highest = self._next_timestamp = None
        self._gap_since_s = self._last_arrival_s = None
        self._concealed_ahead = None

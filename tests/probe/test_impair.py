"""The probe's network impairment: the spec, the loss model, the link, and a real impaired call."""

from __future__ import annotations

import asyncio

import pytest

from lipcast.probe.client import CallOptions, call
from lipcast.probe.impair import (
    GilbertElliott,
    ImpairedPath,
    Impairment,
    ImpairmentError,
    Network,
    is_media,
)
from lipcast.probe.patterns import burst_pattern
from lipcast.server.app import create_app
from lipcast.server.config import Settings


def test_the_spec_reads_every_field_with_its_units() -> None:
    imp = Impairment.parse("loss=2%, burst=4,delay=40ms,jitter=0.03s,rate=0.3mbps,queue=200ms")
    assert imp == Impairment(
        loss=0.02, burst=4.0, delay_ms=40.0, jitter_ms=30.0, rate_kbps=300.0, queue_ms=200.0
    )
    assert Impairment.parse("loss=0.05") == Impairment(loss=0.05)
    assert not Impairment.parse("").active


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("loss=2", "loss"),
        ("drop=2%", "cannot read"),
        ("delay=40kbps", "delay takes"),
        ("burst=0.5", "burst"),
        ("rate=0kbps", "rate"),
    ],
)
def test_a_bad_spec_names_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ImpairmentError, match=message):
        Impairment.parse(spec)
    with pytest.raises(ImpairmentError, match="direction"):
        Network(Impairment(), "sideways")


@pytest.mark.parametrize(("loss", "burst"), [(0.02, 1.0), (0.05, 4.0)])
def test_the_loss_model_keeps_its_long_run_share_and_burst_length(loss: float, burst: float) -> None:
    import random

    model = GilbertElliott(loss, burst, random.Random(7))
    fates = [model.lost() for _ in range(200_000)]
    runs, length = [], 0
    for lost in fates:
        if lost:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    assert sum(fates) / len(fates) == pytest.approx(loss, rel=0.1)
    assert sum(runs) / len(runs) == pytest.approx(burst, rel=0.1)


def test_the_same_seed_gives_the_same_fate_packet_for_packet() -> None:
    imp = Impairment(loss=0.1, burst=2, delay_ms=40, jitter_ms=30)

    def fates(seed: int) -> list[float | None]:
        path = ImpairedPath(imp, lambda _: None, seed=seed)
        return [path.fate(200, i * 0.02) for i in range(500)]

    assert fates(3) == fates(3)
    assert fates(3) != fates(4)
    lost = sum(f is None for f in fates(3))
    assert 20 < lost < 90


def test_the_rate_limit_queues_at_the_link_rate_and_drops_past_the_queue() -> None:
    # 1000-byte packets at 80 kbps: 100 ms each on the link; 4 sent at once with a 250 ms queue.
    path = ImpairedPath(Impairment(rate_kbps=80, queue_ms=250), lambda _: None)
    leaves = [path.fate(1000, 0.0) for _ in range(4)]
    assert leaves[:3] == [pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.3)]
    assert leaves[3] is None  # it would have waited 300 ms
    assert path.stats.queue_drops == 1 and path.stats.max_queue_ms == pytest.approx(200)


def test_only_the_stretch_from_until_is_impaired() -> None:
    imp = Impairment.parse("loss=50%,delay=100ms,from=1s,until=2000ms")
    assert (imp.from_s, imp.until_s) == (1.0, 2.0)
    path = ImpairedPath(imp, lambda _: None, seed=2)
    fates = {t: path.fate(200, t) for t in (i * 0.02 for i in range(150))}
    untouched = [t for t, f in fates.items() if f == t]
    assert all(t < 1.0 or t >= 2.0 for t in untouched) and len(untouched) == 100
    impaired = [f for t, f in fates.items() if 1.0 <= t < 2.0]
    assert any(f is None for f in impaired) and all(f is None or f >= 0.1 for f in impaired)
    assert path.stats.packets == 50  # counted while it impaired
    with pytest.raises(ImpairmentError, match="until"):
        Impairment.parse("from=3s,until=2s")


def test_only_srtp_media_is_impaired() -> None:
    assert is_media(bytes([0x80, 111, 0, 1]))  # RTP, Opus
    assert is_media(bytes([0x80, 96 | 0x80, 0, 1]))  # RTP with the marker bit, VP8
    assert not is_media(bytes([0x80, 200, 0, 6]))  # RTCP sender report
    assert not is_media(bytes([0x81, 205, 0, 3]))  # RTCP feedback (NACK)
    assert not is_media(bytes([22, 254, 253]))  # DTLS
    assert not is_media(bytes([0, 1, 0, 0]))  # STUN


async def test_jitter_larger_than_the_spacing_reorders_and_delivers_everything() -> None:
    delivered: list[int] = []
    path = ImpairedPath(Impairment(delay_ms=20, jitter_ms=15), lambda d: delivered.append(d[0]), seed=1)
    for i in range(40):
        path.push(bytes([i]))
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)
    assert sorted(delivered) == list(range(40))
    assert delivered != sorted(delivered)
    assert path.stats.reordered > 0 and path.stats.delivered == 40


@pytest.mark.slow
@pytest.mark.usefixtures("loopback_ice")
async def test_an_impaired_call_loses_its_share_of_uplink_rtp_and_still_plays(aiohttp_client) -> None:
    client = await aiohttp_client(create_app(Settings()))
    url = str(client.make_url("")).rstrip("/")
    network = Network(Impairment(loss=0.1), "up", seed=5)
    recording = await call(
        url, burst_pattern(4.0, seed=1), tail_s=0.5, http=client.session, options=CallOptions(network=network)
    )
    assert recording.network is not None and recording.network.down is None
    stats = recording.network.up
    assert stats is not None
    # 4 s of 20 ms Opus packets (DTX may skip some silence): about 200, a tenth of them lost
    assert 100 < stats.stats.packets < 260
    assert 0.04 < stats.stats.lost / stats.stats.packets < 0.2
    assert len(recording.video.arrived_at) > 50  # the call went on

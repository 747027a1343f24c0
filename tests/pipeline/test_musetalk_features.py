"""MuseTalk's audio path (spec 2 and 8.1-8.5, 8.15): log-mel, encoder, counts, window, PE, streaming."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lipcast.pipeline.musetalk.features import (
    encoder_states,
    frame_counts,
    gather_windows,
    offline_windows,
    positional_encoding,
    window_start,
)
from lipcast.pipeline.musetalk.featurizer import (
    META_PAD,
    META_REAL,
    META_ROW,
    META_START,
    MuseTalkFeaturizer,
    conditioning_shape,
)
from lipcast.pipeline.musetalk.mel import PIECE_SAMPLES, reference_log_mel
from tests.pipeline.musetalk_fixtures import tiny_models

RNG = np.random.default_rng(7)


def speechy(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = round(seconds * 16000)
    t = np.arange(n) / 16000
    envelope = np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None) ** 2
    return (0.2 * rng.standard_normal(n) * envelope + 0.1 * np.sin(2 * np.pi * 180 * t) * envelope).astype(
        np.float32
    )


@pytest.mark.parametrize(
    "audio",
    [
        RNG.standard_normal(16000 * 3).astype(np.float32) * 0.1,
        (0.5 * np.sin(2 * np.pi * 440 * np.arange(32000) / 16000)).astype(np.float32),
        np.zeros(16000, np.float32),
        RNG.standard_normal(PIECE_SAMPLES).astype(np.float32) * 0.1,
    ],
    ids=["noise", "sine440", "silence", "exactly30s"],
)
def test_log_mel_matches_whisper_feature_extractor(audio: np.ndarray) -> None:
    from transformers import WhisperFeatureExtractor

    expected = WhisperFeatureExtractor()(audio, sampling_rate=16000, return_tensors="np").input_features[0]
    ours = reference_log_mel(audio)
    assert ours.shape == (80, 3000)
    assert np.abs(ours - expected).max() < 1e-4


def test_log_mel_of_silence_is_minus_one_and_a_half_and_m_is_per_piece() -> None:
    assert np.all(reference_log_mel(np.zeros(16000, np.float32)) == -1.5)
    loud_then_quiet = np.concatenate([speechy(30.0) * 3, 0.001 * speechy(1.0, seed=1)])
    first = reference_log_mel(loud_then_quiet[:PIECE_SAMPLES])
    second = reference_log_mel(loud_then_quiet[PIECE_SAMPLES:])
    # each piece floors at its own maximum M minus 8: the loud piece's zero-padded tail sits there (a range
    # of 2 after the scale); the quiet piece's M - 8 lies below log10(1e-10), so its floor is -1.5, where a
    # maximum over the whole recording would have floored it at the loud piece's level
    assert first.max() - first.min() == pytest.approx(2.0)
    assert second.min() == pytest.approx(-1.5) and first.min() > -1.4


def test_encoder_gives_five_states_the_last_post_layernorm_and_refuses_other_lengths() -> None:
    encoder = tiny_models().whisper
    mel = torch.from_numpy(reference_log_mel(speechy(2.0)))[None]
    with torch.no_grad():
        states = encoder_states(encoder, mel)
        out = encoder(mel, output_hidden_states=True)
        assert states.shape == (1, 1500, 5, 32)
        assert torch.equal(states[:, :, 4], out.last_hidden_state)
        assert encoder.layers[0].self_attn.k_proj.bias is None
        with pytest.raises(ValueError):
            encoder(mel[:, :, :2000])


def test_frame_counts_follow_the_reference_float_expressions() -> None:
    assert frame_counts(18_560) == (28, 57)
    assert frame_counts(16_000) == (25, 50)


def test_window_slots_padding_and_row_order() -> None:
    frames, layers = 40, 5
    states = torch.zeros(1, 1500, layers, 1)
    for k in range(frames):
        for level in range(layers):
            states[0, k, level, 0] = 10 * k + level + 1  # +1: zero means "a zero slot"
    real = torch.tensor([frames])

    def window(f: int) -> torch.Tensor:
        return gather_windows(states, torch.tensor([window_start(f)]), real)[0, :, 0].reshape(10, 5)

    assert torch.all(window(0)[:4] == 0) and window(0)[4, 0] == 1
    assert torch.all(window(1)[:2] == 0) and window(1)[2, 0] == 1
    for f in range(2, 17):
        w = window(f)
        for t in range(10):
            assert w[t, 0] == 10 * (2 * f - 4 + t) + 1
            assert torch.equal(w[t], 10 * (2 * f - 4 + t) + 1 + torch.arange(5.0))  # row r = 5 t + l
    last = window(19)  # slots 2 * 19 - 4 + t >= 40 are zero
    assert torch.all(last[6:] == 0) and torch.all(last[:6] > 0)


def test_positional_encoding_values() -> None:
    pe = positional_encoding(384)
    expected = {
        (0, 0): 0.0, (0, 1): 1.0, (1, 0): 0.84147102, (1, 1): 0.54030228, (1, 2): 0.81525069,
        (1, 3): 0.57910824, (7, 100): 0.59395194, (7, 101): 0.80450052, (49, 0): -0.95375264,
        (49, 1): 0.30059254, (49, 382): 0.00514076, (49, 383): 0.99998677,
    }  # fmt: skip
    for (p, i), value in expected.items():
        assert float(pe[p, i]) == pytest.approx(value, abs=1e-6), (p, i)


def _streamed_windows(audio: np.ndarray, featurizer: MuseTalkFeaturizer, unlimited: bool) -> torch.Tensor:
    """Push ``audio`` hop by hop; with ``unlimited`` each frame is taken once its whole piece is in."""
    hop = featurizer.samples_per_frame
    conds = []
    hops = len(audio) // hop
    n, _ = frame_counts(len(audio))
    for i in range(hops):
        cond = featurizer.push(audio[i * hop : (i + 1) * hop])
        if not unlimited and i >= featurizer.lag_frames:
            conds.append(cond)
    if unlimited:
        featurizer.extend_tail(audio[hops * hop :])
        conds = [featurizer.conditioning(f) for f in range(n)]
    c = torch.from_numpy(np.stack(conds[:n]))
    mel = c[:, META_ROW, META_PAD][:, None, None].expand(len(c), 80, 3000).clone()
    mel[:, :, : c.shape[2]] = c[:, :80]
    with torch.no_grad():
        states = encoder_states(tiny_models().whisper, mel)
    return gather_windows(states, c[:, META_ROW, META_START].long(), c[:, META_ROW, META_REAL].long())


def test_unlimited_lookahead_reproduces_the_offline_features_exactly() -> None:
    audio = speechy(6.3, seed=3)
    offline = offline_windows(tiny_models().whisper, audio)
    featurizer = MuseTalkFeaturizer(context_s=30, rebase_s=30, lookahead_ms=0, floor="input")
    streamed = _streamed_windows(audio, featurizer, unlimited=True)
    assert torch.equal(streamed.reshape(offline.shape), offline)


def test_a_finite_lookahead_deviates_and_80_ms_leaves_no_zero_slot() -> None:
    audio = speechy(3.0, seed=4)
    offline = offline_windows(tiny_models().whisper, audio)
    featurizer = MuseTalkFeaturizer(context_s=30, rebase_s=30, lookahead_ms=80, floor="input")
    assert featurizer.lookahead_samples == 1280
    streamed = _streamed_windows(audio, featurizer, unlimited=False).reshape(-1, 10, 5, 32)
    n = min(len(streamed), len(offline))
    assert not torch.equal(streamed[:n], offline[:n])  # the encoder saw less of the future
    assert torch.all(streamed[2:n].abs().sum(dim=(2, 3)) > 0)  # every slot of every frame from 2 on is real
    # the embedding layer sees only +-32.5 ms: at 80 ms lookahead its deviation is the floor's alone
    rel = (streamed[2:n, :, 0] - offline[2:n, :, 0]).norm() / offline[2:n, :, 0].norm()
    assert rel < 0.2


def test_featurizer_shape_lag_and_settings() -> None:
    featurizer = MuseTalkFeaturizer(context_s=10, lookahead_ms=120)
    assert conditioning_shape(10) == (81, 1002)
    first = featurizer.push(np.zeros(640, np.float32))
    assert first.shape == (81, 1002) and first[META_ROW, META_START] < -1000  # silence before frame 0
    for _ in range(3):
        cond = featurizer.push(np.zeros(640, np.float32))
    assert cond[META_ROW, META_START] == window_start(0) and cond[META_ROW, META_REAL] == 8  # 160 ms
    with pytest.raises(ValueError, match="multiple of 40"):
        MuseTalkFeaturizer(lookahead_ms=50)
    with pytest.raises(ValueError, match="floor"):
        MuseTalkFeaturizer(floor="loudest")
    with pytest.raises(ValueError, match="hop"):
        featurizer.push(np.zeros(320, np.float32))


def test_the_origin_moves_on_so_the_input_never_exceeds_the_context() -> None:
    featurizer = MuseTalkFeaturizer(context_s=2, rebase_s=1, lookahead_ms=0)  # W/2
    audio = speechy(5.0)
    starts = []
    for i in range(len(audio) // 640):
        cond = featurizer.push(audio[i * 640 : (i + 1) * 640])
        assert cond[META_ROW, META_REAL] <= 100
        starts.append(cond[META_ROW, META_START])
    assert min(starts[60:]) >= 46  # after a rebase the frame sits >= 1 s into the input
    assert max(starts) <= 2 * 50 - 6


def test_deviation_tool_sanity_case_and_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import wave

    from lipcast.pipeline.musetalk.deviation import Candidate, format_table, run

    audio = np.concatenate([speechy(1.2, seed=5), np.zeros(8000, np.float32), speechy(1.0, seed=6)])
    path = tmp_path / "speech.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((audio * 32767).astype(np.int16).tobytes())
    candidates = [Candidate(None, 30.0, None, "input"), Candidate(80.0, 30.0, None, "running")]
    report = run([path], candidates, tiny_models().whisper, torch.device("cpu"))
    assert report["sanity_max_abs"] == 0.0
    rows = {(r["candidate"], r["layer"]): r for r in report["rows"]}
    exact = rows[("L=infms W=30s floor=input", "mel")]
    assert exact["speech_rel_l2"] == (0.0, 0.0) and exact["silence_rel_l2"] == (0.0, 0.0)
    live = rows[("L=80ms W=30s floor=running", 0)]
    assert live["speech_rel_l2"][0] > 0
    table = format_table(report)
    assert "| L=80ms W=30s floor=running | mel |" in table and "sanity" in table


def test_frames_at_a_piece_end_come_from_their_own_piece() -> None:
    featurizer = MuseTalkFeaturizer(context_s=2, lookahead_ms=80)  # whole 2 s pieces, 2 frames of lag
    audio = speechy(4.0, seed=8)
    emitted = []
    for i in range(len(audio) // 640):
        cond = featurizer.push(audio[i * 640 : (i + 1) * 640])
        if i >= featurizer.lag_frames:
            emitted.append((int(cond[META_ROW, META_START]), int(cond[META_ROW, META_REAL])))
    # frames 48 and 49 (the piece's last 80 ms) still sit at the end of the first piece, capped at 2 s ...
    assert emitted[48] == (window_start(48), 100) and emitted[49] == (window_start(49), 100)
    # ... and frame 50 starts the next piece, as the reference's 30 s pieces do
    assert emitted[50][0] == window_start(0) and emitted[50][1] == 2 + 4

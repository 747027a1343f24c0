"""The Wav2Lip generator as a pure ``nn.Module`` (no file, device or audio logic).

Parameter names and shapes match the published checkpoints (352 state_dict keys, 36,298,035 parameters).
Besides :meth:`Wav2Lip.forward` the network is split into its three parts so that a server can run the face
encoder once per avatar frame, cache its seven skip features, and run only the audio encoder and the decoder
per rendered frame:

    feats = model.encode_face(face)        # 7 tensors, (N,16,96,96) ... (N,512,1,1)
    emb = model.encode_audio(mel)          # (N,512,1,1)
    image = model.decode(emb, feats)       # (N,3,96,96), BGR in (0,1)

Faces are BGR in [0, 1]: channels 0-2 the copy with rows 48..95 zeroed, channels 3-5 the unmasked copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

FACE_SIZE_PX = 96
FACE_CHANNELS = 6  # masked BGR copy + reference BGR copy
N_MELS = 80
MEL_WINDOW_FRAMES = 16  # 0.2 s of 12.5 ms mel frames
EMBEDDING_CHANNELS = 512
N_FACE_FEATURES = 7  # one skip feature per face encoder block, 96x96 down to 1x1
FACE_FEATURE_SHAPES: tuple[tuple[int, int, int], ...] = (
    (16, 96, 96),
    (32, 48, 48),
    (64, 24, 24),
    (128, 12, 12),
    (256, 6, 6),
    (512, 3, 3),
    (512, 1, 1),
)

Size2 = int | tuple[int, int]


class ConvUnit(nn.Module):
    """Conv2d (with bias) -> BatchNorm2d -> optional residual add of the input -> ReLU.

    The residual add happens after BN and before the ReLU. After BN folding ``conv_block[1]`` is an
    ``nn.Identity``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: Size2,
        padding: int,
        residual: bool = False,
    ) -> None:
        super().__init__()
        self.conv_block = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding),
            nn.BatchNorm2d(out_channels),
        )
        self.act = nn.ReLU()
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv_block(x)
        if self.residual:
            out = out + x
        return self.act(out)


class ConvTransposeUnit(nn.Module):
    """ConvTranspose2d (with bias; weight ``(cin, cout, k, k)``) -> BatchNorm2d -> ReLU."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int,
        padding: int,
        output_padding: int = 0,
    ) -> None:
        super().__init__()
        self.conv_block = nn.Sequential(
            nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride, padding, output_padding),
            nn.BatchNorm2d(out_channels),
        )
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv_block(x))


def _res(channels: int) -> ConvUnit:
    """A residual 3x3 unit that keeps channels and size."""
    return ConvUnit(channels, channels, 3, 1, 1, residual=True)


def _down(in_channels: int, out_channels: int, stride: Size2 = 2) -> ConvUnit:
    """A 3x3 padding-1 unit that changes channels (stride 2 halves the size)."""
    return ConvUnit(in_channels, out_channels, 3, stride, 1)


def _up(in_channels: int, out_channels: int) -> ConvTransposeUnit:
    """A 3x3 stride-2 transposed unit that doubles the size exactly (output_padding 1)."""
    return ConvTransposeUnit(in_channels, out_channels, 3, 2, 1, output_padding=1)


class Wav2Lip(nn.Module):
    """The Wav2Lip generator (Prajwal et al. 2020), layer for layer as in the published checkpoints."""

    def __init__(self) -> None:
        super().__init__()
        self.face_encoder_blocks = nn.ModuleList(
            [
                nn.Sequential(ConvUnit(6, 16, 7, 1, 3)),  # 96x96
                nn.Sequential(_down(16, 32), _res(32), _res(32)),  # 48x48
                nn.Sequential(_down(32, 64), _res(64), _res(64), _res(64)),  # 24x24
                nn.Sequential(_down(64, 128), _res(128), _res(128)),  # 12x12
                nn.Sequential(_down(128, 256), _res(256), _res(256)),  # 6x6
                nn.Sequential(_down(256, 512), _res(512)),  # 3x3
                nn.Sequential(ConvUnit(512, 512, 3, 1, 0), ConvUnit(512, 512, 1, 1, 0)),  # 1x1
            ]
        )
        self.audio_encoder = nn.Sequential(
            ConvUnit(1, 32, 3, 1, 1),  # 80x16
            _res(32),
            _res(32),
            _down(32, 64, stride=(3, 1)),  # 27x16
            _res(64),
            _res(64),
            _down(64, 128, stride=3),  # 9x6
            _res(128),
            _res(128),
            _down(128, 256, stride=(3, 2)),  # 3x3
            _res(256),
            ConvUnit(256, 512, 3, 1, 0),  # 1x1
            ConvUnit(512, 512, 1, 1, 0),
        )
        self.face_decoder_blocks = nn.ModuleList(
            [
                nn.Sequential(ConvUnit(512, 512, 1, 1, 0)),  # 1x1
                nn.Sequential(ConvTransposeUnit(1024, 512, 3, 1, 0), _res(512)),  # 3x3
                nn.Sequential(_up(1024, 512), _res(512), _res(512)),  # 6x6
                nn.Sequential(_up(768, 384), _res(384), _res(384)),  # 12x12
                nn.Sequential(_up(512, 256), _res(256), _res(256)),  # 24x24
                nn.Sequential(_up(320, 128), _res(128), _res(128)),  # 48x48
                nn.Sequential(_up(160, 64), _res(64), _res(64)),  # 96x96
            ]
        )
        self.output_block = nn.Sequential(
            ConvUnit(80, 32, 3, 1, 1),
            nn.Conv2d(32, 3, kernel_size=1, stride=1, padding=0),
            nn.Sigmoid(),
        )

    def encode_face(self, face: torch.Tensor) -> list[torch.Tensor]:
        """``face`` (N, 6, 96, 96) -> the 7 skip features, shallowest first (see FACE_FEATURE_SHAPES)."""
        feats = []
        x = face
        for block in self.face_encoder_blocks:
            x = block(x)
            feats.append(x)
        return feats

    def encode_audio(self, audio: torch.Tensor) -> torch.Tensor:
        """``audio`` (N, 1, 80, 16) mel windows -> embedding (N, 512, 1, 1)."""
        return self.audio_encoder(audio)

    def decode(self, audio_embedding: torch.Tensor, face_feats: Sequence[torch.Tensor]) -> torch.Tensor:
        """Embedding (N, 512, 1, 1) and the 7 face features -> image (N, 3, 96, 96), BGR in (0, 1).

        Each decoder block's output is concatenated with the face feature of the same size, decoder output
        first; the features are consumed deepest (1x1) first. ``face_feats`` is not modified.
        """
        if len(face_feats) != N_FACE_FEATURES:
            raise ValueError(f"expected {N_FACE_FEATURES} face features, got {len(face_feats)}")
        x = audio_embedding
        for block, skip in zip(self.face_decoder_blocks, reversed(face_feats), strict=True):
            x = torch.cat((block(x), skip), dim=1)
        return self.output_block(x)

    def forward(self, audio: torch.Tensor, face: torch.Tensor) -> torch.Tensor:
        """Audio first, face second.

        4-D form: ``audio`` (N, 1, 80, 16), ``face`` (N, 6, 96, 96) -> (N, 3, 96, 96).
        5-D (training) form: ``audio`` (B, T, 1, 80, 16), ``face`` (B, 6, T, 96, 96) -> (B, 3, T, 96, 96),
        frames flattened time-major into the batch.
        """
        if face.dim() > 4:
            batch, steps = audio.shape[0], audio.shape[1]
            audio = torch.cat([audio[:, t] for t in range(steps)], dim=0)
            face = torch.cat([face[:, :, t] for t in range(steps)], dim=0)
            out = self.decode(self.encode_audio(audio), self.encode_face(face))
            return torch.stack(torch.split(out, batch, dim=0), dim=2)
        return self.decode(self.encode_audio(audio), self.encode_face(face))

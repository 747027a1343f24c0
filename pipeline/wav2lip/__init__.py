"""Wav2Lip: the generator network, its checkpoint loader, mel front end, face inputs and the backend.

The network and the checkpoint format follow the published Wav2Lip (Prajwal et al. 2020); no original code
or weights are included: the user supplies a generator checkpoint (``wav2lip.pth`` or ``wav2lip_gan.pth``).
"""

from __future__ import annotations

from lipcast.pipeline.wav2lip.backend import Wav2LipBackend
from lipcast.pipeline.wav2lip.checkpoint import CheckpointError, load_checkpoint, load_wav2lip
from lipcast.pipeline.wav2lip.featurizer import INFERENCE_ALIGNMENT, TRAINING_ALIGNMENT, Wav2LipFeaturizer
from lipcast.pipeline.wav2lip.fold import fold_batchnorm
from lipcast.pipeline.wav2lip.mel import StreamingMel, melspectrogram
from lipcast.pipeline.wav2lip.model import Wav2Lip

__all__ = [
    "INFERENCE_ALIGNMENT",
    "TRAINING_ALIGNMENT",
    "CheckpointError",
    "StreamingMel",
    "Wav2Lip",
    "Wav2LipBackend",
    "Wav2LipFeaturizer",
    "fold_batchnorm",
    "load_checkpoint",
    "load_wav2lip",
    "melspectrogram",
]

"""Audio files: decoding any file PyAV reads into mono samples at a chosen rate (``lipcast render``, the
probe's ``--wav``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, overload

import av
import numpy as np
import numpy.typing as npt


@overload
def decode_audio(
    path: Path, rate_hz: int, sample_format: Literal["flt"] = ...
) -> npt.NDArray[np.float32]: ...


@overload
def decode_audio(path: Path, rate_hz: int, sample_format: Literal["s16"]) -> npt.NDArray[np.int16]: ...


def decode_audio(path: Path, rate_hz: int, sample_format: Literal["flt", "s16"] = "flt") -> npt.NDArray[Any]:
    """The file's first audio stream, mono at ``rate_hz``: float32 in [-1, 1] (``flt``) or int16 (``s16``).

    Raises ``ValueError`` when the file has no audio stream or no samples in it (and PyAV's errors when it
    cannot be read).
    """
    dtype = np.float32 if sample_format == "flt" else np.int16
    resampler = av.AudioResampler(format=sample_format, layout="mono", rate=rate_hz)
    chunks: list[npt.NDArray[Any]] = []
    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise ValueError(f"{path} has no audio stream")
        for frame in container.decode(audio=0):
            chunks.extend(f.to_ndarray().reshape(-1).astype(dtype) for f in resampler.resample(frame))
    chunks.extend(f.to_ndarray().reshape(-1).astype(dtype) for f in resampler.resample(None))
    if not chunks:
        raise ValueError(f"{path} holds no audio")
    return np.concatenate(chunks).astype(dtype)

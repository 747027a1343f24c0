"""What MuseTalk's live featurizer costs a media worker's CPU per push (one 40 ms hop in, one frame out).

python benchmarks/musetalk_featurizer.py [--seconds 40] [--contexts 30,10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lipcast.pipeline.musetalk.featurizer import MuseTalkFeaturizer
from lipcast.pipeline.warmup import speech_like_audio


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--contexts", default="30,10")
    args = parser.parse_args()
    audio = speech_like_audio(args.seconds)
    MuseTalkFeaturizer().push(audio[:640])  # the one-time import of the mel filters, outside the timing
    for context in (float(c) for c in args.contexts.split(",")):
        featurizer = MuseTalkFeaturizer(context_s=context)
        times_ms = []
        for i in range(len(audio) // 640):
            start = time.perf_counter()
            featurizer.push(audio[i * 640 : (i + 1) * 640])
            times_ms.append((time.perf_counter() - start) * 1000.0)
        t = np.array(times_ms)
        print(
            f"context {context:g} s: push p50 {np.median(t):.3f} ms, p99 {np.percentile(t, 99):.3f} ms, "
            f"max {t.max():.2f} ms over {len(t)} pushes"
        )


if __name__ == "__main__":
    main()

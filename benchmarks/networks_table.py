"""The Networks table of docs/performance.md from a `benchmarks/networks.sh` run: one line per row (spec,
direction), seeds side by side. Usage: python benchmarks/networks_table.py OUT_DIR"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def cells(report: dict[str, Any]) -> dict[str, str]:
    s = report["summary"]
    session = report["sessions"][0]
    out = {
        "p50": f"{s['audio_delay_ms']['p50']:.1f}",
        "back": f"{100 * s['audio_returned_min']:.1f} %",
        "gap": f"{session['max_frame_gap_ms']:.0f}",
        "fps": f"{s['fps_min']:.1f}",
        "mouth": "-" if s.get("mouth_correlation_min") is None else f"{s['mouth_correlation_min']:.2f}",
    }
    for r in s.get("delay_recovery") or []:
        recovered = "never" if r["recovered_s"] is None else f"{r['recovered_s']:.0f} s"
        out["p50"] = f"{r['during_ms']:.1f} (before {r['before_ms']:.1f}; back in {recovered})"
    for r in s.get("downlink_rate") or []:
        out["fps"] += (
            f" (sent video {r['video_kbps_p50']:.0f} kbps, all media {r['sent_kbps_p50']:.0f};"
            f" video under the cap from {r['under_cap_from_s']} s;"
            f" frame latency {r['frame_latency_first_half_ms']} -> {r['frame_latency_second_half_ms']} ms)"
        )
    return out


def main(out_dir: str) -> None:
    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    for path in sorted(Path(out_dir).glob("*.json")):
        name = path.stem.rstrip("_").rsplit("-", 1)[0]  # SPEC-DIR (the seed is the last part)
        rows[name].append(cells(json.loads(path.read_text())))
    header = ("network", "audio in -> out p50 (ms)", "audio back", "longest video gap (ms)", "fps", "mouth")
    print("| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|")
    for name, seeds in rows.items():
        joined = {k: " / ".join(c[k] for c in seeds) for k in seeds[0]}
        columns = (name, joined["p50"], joined["back"], joined["gap"], joined["fps"], joined["mouth"])
        print("| " + " | ".join(columns) + " |")


if __name__ == "__main__":
    main(sys.argv[1])

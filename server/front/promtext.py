"""Runs in the **front**: one Prometheus exposition from several processes' texts.

Every sample gets a ``process`` label (``front``, ``worker-0``, ...) and each metric family is written once,
with the samples of all processes under it, so ``sum(lipcast_sessions_active)`` is the server's total and
``lipcast_engine_*{process="front"}`` the shared engine's own figures.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"


def merge_expositions(texts: Iterable[tuple[str, str]]) -> str:
    """``texts``: (process name, exposition text) pairs -> one exposition text."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for process, text in texts:
        for family in text_string_to_metric_families(text):
            entry = families.setdefault(family.name, (family.type, family.documentation, []))
            for sample in family.samples:
                labels = {"process": process, **sample.labels}
                rendered = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                entry[2].append(f"{sample.name}{{{rendered}}} {_number(sample.value)}")
    lines: list[str] = []
    for name, (kind, doc, samples) in families.items():
        lines.append(f"# HELP {name} {_escape(doc)}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"

"""What the machine offers tests that go beyond one process: a browser, network namespaces."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)"
)
needs_netns = pytest.mark.skipif(
    shutil.which("ip") is None or os.geteuid() != 0,
    reason="needs root and iproute2 for a loopback-only network namespace",
)


def in_netns(netns: str, module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` (this interpreter) inside ``netns``."""
    return ["ip", "netns", "exec", netns, sys.executable, "-m", module, *args]

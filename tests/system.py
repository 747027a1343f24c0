"""What the machine offers tests that go beyond one process: a browser, network namespaces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Skip reasons that name a missing Debian package end with this: the test summary then says how to get it.
INSTALL_HINT = "(make test-deps installs it)"
# as root: .ci/install-test-packages (chromium, nginx, iproute2, GStreamer, npm)
INSTALL_COMMAND = "make test-deps"

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=f"chromium is not installed {INSTALL_HINT}")
needs_netns = pytest.mark.skipif(
    shutil.which("ip") is None or os.geteuid() != 0,
    reason=f"needs root and iproute2 for a loopback-only network namespace {INSTALL_HINT}",
)


def in_netns(netns: str, module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` (this interpreter) inside ``netns``."""
    return ["ip", "netns", "exec", netns, sys.executable, "-m", module, *args]


REPOSITORY = Path(__file__).resolve().parents[1]


def run_in_netns(netns: str, module: str, *args: str, timeout_s: float = 120) -> dict[str, Any]:
    """Run ``python -m module args`` inside ``netns`` from the repository's root; it must succeed, and what
    it printed (one JSON object) is returned."""
    run = subprocess.run(
        in_netns(netns, module, *args), cwd=REPOSITORY, capture_output=True, text=True, timeout=timeout_s
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result: dict[str, Any] = json.loads(run.stdout)
    return result

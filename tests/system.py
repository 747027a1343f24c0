"""What the machine offers tests that go beyond one process: a browser, network namespaces."""

from __future__ import annotations

import os
import shutil
import sys

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

from __future__ import annotations

import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import torch

from tests.system import INSTALL_COMMAND, INSTALL_HINT


@pytest.fixture
def loopback_ice() -> Iterator[None]:
    """aioice never offers 127.0.0.1; tests run both peers on loopback only."""
    from lipcast.streaming.rtc import restrict_host_addresses

    restore = restrict_host_addresses(["127.0.0.1"])
    yield
    restore()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace with only loopback: what starts in it (servers, browsers, nginx) reaches nothing
    else. Tests that use it carry :data:`tests.system.needs_netns`."""
    name = f"lipcast-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test's report gives (``Skipped: `` prefix removed)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say at the end what was skipped and why; for missing Debian packages, the one command that fixes it."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = Counter(skip_reason(r) for r in skipped)
    terminalreporter.section("skipped tests, by reason")
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:4d}  {reason}")
    if any(INSTALL_HINT in reason for reason in reasons):
        terminalreporter.write_line(
            f"To run them: `sudo {INSTALL_COMMAND}` (Debian's chromium, nginx, iproute2, GStreamer, npm), "
            "then `make test`."
        )


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Drop a finished test's fixture values: pytest keeps every item (and so its ``funcargs``) for the
    whole session, and an app's test client holds its whole runtime (engine, avatars, their idle frames:
    ~230 MB with the 1280x720 built-in avatar), so the suite grew past the box's memory."""
    yield
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict):
        funcargs.clear()

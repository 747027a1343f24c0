from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def loopback_ice() -> Iterator[None]:
    """aioice never offers 127.0.0.1; tests run both peers on loopback only."""
    from streaming.rtc import restrict_host_addresses

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

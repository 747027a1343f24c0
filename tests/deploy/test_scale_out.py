"""Scale-out on one machine: nginx (the shipped deploy/nginx/lipcast.conf) in front of two lipcast processes,
``lipcast probe`` calling through it, all inside a loopback-only network namespace. Checks that the calls are
spread over both instances, that each call is served from offer to hang-up by one instance, and that each one
is as good as a call to a single server. Runs as root with nginx and iproute2 installed (CI: .ci/run)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.system import INSTALL_HINT, in_netns, needs_netns

ROOT = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
# Two calls, one per instance, and then a third offer while both are full. More calls than that do not fit a
# 2-core machine with one core busy elsewhere (each call costs ~0.25 cores in its server and ~0.15 in the
# probe): the probe itself then falls seconds behind, and what is measured is the machine.
SESSIONS = 2
# Long enough that one audio block lost on a busy 2-core machine stays within the 1% allowed: 5 s of the
# probe's pattern carry ~98 blocks with sound (one lost: 98.98%), 8 s about 160.
DURATION_S = 8.0
CAPACITIES = (1, 1)
ACCESS = re.compile(
    r"^\S+ (?P<method>\S+) (?P<uri>\S+) (?P<status>\d+) upstream=(?P<upstreams>.*) "
    r"upstream_status=(?P<statuses>.*) rt=\S+$"
)
CREATED = re.compile(r"\[(?P<id>[A-Za-z0-9_-]+)\] created")

pytestmark = pytest.mark.skipif(NGINX is None, reason=f"nginx is not installed {INSTALL_HINT}")


def drive(netns: str, workdir: Path) -> dict[str, Any]:
    """Run the driver in the namespace; on a timeout end its whole process group (servers, nginx)."""
    proc = subprocess.Popen(
        in_netns(
            netns,
            "tests.deploy.drive_scale_out",
            "--workdir",
            str(workdir),
            "--sessions",
            str(SESSIONS),
            "--duration-s",
            str(DURATION_S),
            "--max-sessions",
            ",".join(map(str, CAPACITIES)),
        ),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-3000:]
    return dict(json.loads(out))


def access_log(lines: list[str]) -> list[dict[str, Any]]:
    entries = []
    for line in lines:
        m = ACCESS.match(line)
        assert m, line
        entries.append(
            {
                "method": m["method"],
                "uri": m["uri"],
                "status": int(m["status"]),
                "upstreams": [u.strip() for u in m["upstreams"].split(",")],
                "statuses": [s.strip() for s in m["statuses"].split(",")],
            }
        )
    return entries


@pytest.mark.slow
@needs_netns
def test_nginx_spreads_calls_over_two_instances_and_each_call_stays_on_one(
    netns: str, tmp_path: Path
) -> None:
    result = drive(netns, tmp_path)
    probe = result["probe"]
    assert result["probe_rc"] == 0 and probe, result["probe_stdout"] + result["probe_stderr"]
    assert not probe["errors"], probe["errors"]

    # Every call is as good as one to a single server: media flows straight between the client and the
    # instance that answered its offer (paced at 25 fps, all the audio back).
    summary = probe["summary"]
    print(result["probe_stdout"])
    assert summary["sessions"] == SESSIONS
    assert 20 <= summary["fps_min"] and summary["fps_mean"] <= 26, result["probe_stdout"]
    # Audio: all of it back (a jitter buffer left dry by the busy machine delays audio, which the analysis
    # follows; it does not lose it). A call whose media went astray returns nothing.
    assert summary["audio_returned_min"] >= 0.99, result["probe_stdout"]

    # Which instance created which session (each server logs "[id] created").
    owner: dict[str, str] = {}
    for port, instance in result["instances"].items():
        for session_id in CREATED.findall(instance["log"]):
            assert session_id not in owner, f"{session_id} created twice"
            owner[session_id] = f"127.0.0.1:{port}"
    call_ids = [s["session_id"] for s in probe["sessions"]]
    assert sorted(owner) == sorted(call_ids)

    # Spread over both, within each one's capacity, and media flowed from both.
    per_instance = Counter(owner.values())
    for (port, instance), capacity in zip(result["instances"].items(), CAPACITIES, strict=True):
        address = f"127.0.0.1:{port}"
        assert 0 < per_instance[address] <= capacity, per_instance
        assert instance["after"]["frames_sent_total"] > 0, instance["after"]
        assert instance["after"]["sessions"] == 0, "a call outlived its hang-up"

    entries = access_log(result["access_log"])
    offers = [e for e in entries if e["method"] == "POST" and e["uri"] == "/offer"]
    accepted = [e for e in offers if e["status"] == 200]
    assert len(accepted) == SESSIONS, offers
    assert Counter(e["upstreams"][-1] for e in accepted) == per_instance
    # The offer made while both were full: each instance turned it away with 503, nginx passed it on to the
    # next (as it does to one with room), and the client got the 503 with Retry-After and lipcast's message.
    full = result["full_offer"]
    assert full is not None, "the instances never reported themselves full"
    assert full["status"] == 503 and full["retry_after"] and "sessions are in use" in full["error"], full
    refused = [e for e in offers if e["status"] == 503]
    assert len(refused) == 1 and refused[0]["statuses"] == ["503", "503"], offers
    assert sorted(refused[0]["upstreams"]) == sorted(f"127.0.0.1:{p}" for p in result["instances"]), offers

    # Each hang-up reached the instance that created the call (a wrong one answers 404, and nginx moves on).
    deletes = {e["uri"].rsplit("/", 1)[-1]: e for e in entries if e["method"] == "DELETE"}
    assert sorted(deletes) == sorted(call_ids)
    for session_id, e in deletes.items():
        assert e["status"] == 204, e
        assert e["upstreams"][-1] == owner[session_id], (session_id, e)
        assert all(s == "404" for s in e["statuses"][:-1]), e


@needs_netns
def test_the_shipped_nginx_config_is_valid(netns: str, tmp_path: Path) -> None:
    """``nginx -t`` binds the config's port 80: in a namespace of its own it is always free."""
    from tests.deploy.drive_scale_out import write_nginx_config

    conf = write_nginx_config(tmp_path)
    run = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            netns,
            str(NGINX),
            "-t",
            "-e",
            "stderr",
            "-p",
            str(tmp_path),
            "-c",
            str(conf),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr

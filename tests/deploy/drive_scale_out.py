"""Run inside a loopback-only network namespace, as root: two ``lipcast serve`` processes, nginx in front of
them with the shipped ``deploy/nginx/lipcast.conf``, and ``lipcast probe`` calling through nginx. Prints what
it saw as JSON; every process it started is ended before it exits.

    ip netns exec NS .venv/bin/python -m tests.deploy.drive_scale_out --workdir DIR --sessions 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from aiortc import RTCConfiguration, RTCPeerConnection

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = ROOT / "deploy" / "nginx" / "lipcast.conf"
FRONT_URL = "http://127.0.0.1:80"  # the shipped config listens on 80; the namespace has it to itself
INSTANCE_PORTS = (8101, 8102)

MAIN_CONF = """\
user root;
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/nginx.error.log notice;
events {{ worker_connections 256; }}
http {{
    client_body_temp_path {work}/nginx-tmp/body;
    proxy_temp_path {work}/nginx-tmp/proxy;
    fastcgi_temp_path {work}/nginx-tmp/fastcgi;
    uwsgi_temp_path {work}/nginx-tmp/uwsgi;
    scgi_temp_path {work}/nginx-tmp/scgi;
    include lipcast.conf;
}}
"""


def get_json(url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return dict(json.load(response))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_ready(url: str, deadline: float, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """Poll /readyz until it answers 200; fail at once, with the log's end, if the process has exited."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} before it was ready:\n{tail}")
        ready = get_json(f"{url}/readyz")  # 503 (None here) while warming up
        if ready and ready.get("ready"):
            return ready
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise TimeoutError(f"{url} did not become ready:\n{tail}")


def write_nginx_config(work: Path) -> Path:
    """The shipped site config, with only its access log moved into the work directory."""
    (work / "nginx-tmp").mkdir(exist_ok=True)
    site = NGINX_CONF.read_text()
    shipped_log = "/var/log/nginx/lipcast.access.log"
    if shipped_log not in site:
        raise RuntimeError(f"{NGINX_CONF} no longer logs to {shipped_log}; update this driver")
    (work / "lipcast.conf").write_text(site.replace(shipped_log, str(work / "nginx.access.log")))
    (work / "lipcast-instances.conf").write_text(
        "".join(f"server 127.0.0.1:{port} max_fails=0;\n" for port in INSTANCE_PORTS)
    )
    main = work / "nginx.conf"
    main.write_text(MAIN_CONF.format(work=work))
    return main


def wait_full(deadline: float, probe: subprocess.Popen[str]) -> bool:
    """Wait until every instance's /readyz says it has no capacity left (the probe's calls are placed)."""
    while time.monotonic() < deadline and probe.poll() is None:
        ready = [get_json(f"http://127.0.0.1:{port}/healthz") for port in INSTANCE_PORTS]
        if all(r is not None and r["sessions"] >= r["max_sessions"] for r in ready):
            return True
        time.sleep(0.1)
    return False


async def offer_when_full() -> dict[str, Any]:
    """POST a real offer through nginx; returns its status, Retry-After and error message."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        body = {"sdp": pc.localDescription.sdp, "type": "offer"}
        async with aiohttp.ClientSession() as http, http.post(f"{FRONT_URL}/offer", json=body) as response:
            answer = await response.json(content_type=None)
            return {
                "status": response.status,
                "retry_after": response.headers.get("Retry-After"),
                "error": answer.get("error"),
            }
    finally:
        await pc.close()


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(work: Path, sessions: int, duration_s: float, max_sessions: tuple[int, ...]) -> dict[str, Any]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for port, capacity in zip(INSTANCE_PORTS, max_sessions, strict=True):
            log = open(work / f"instance-{port}.log", "wb")
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "lipcast",
                        "serve",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--ice-address",
                        "127.0.0.1",
                        "--max-sessions",
                        str(capacity),
                    ],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            )
        conf = write_nginx_config(work)
        subprocess.run([nginx, "-t", "-q", "-e", "stderr", "-p", str(work), "-c", str(conf)], check=True)
        nginx_log = open(work / "nginx.stderr.log", "wb")
        logs.append(nginx_log)
        procs.append(
            subprocess.Popen(
                [nginx, "-e", "stderr", "-p", str(work), "-c", str(conf), "-g", "daemon off;"],
                stdout=nginx_log,
                stderr=subprocess.STDOUT,
            )
        )
        deadline = time.monotonic() + 60
        for port, proc in zip(INSTANCE_PORTS, procs, strict=False):
            wait_ready(f"http://127.0.0.1:{port}", deadline, proc, work / f"instance-{port}.log")
        wait_ready(FRONT_URL, deadline, procs[-1], work / "nginx.stderr.log")
        before = {port: get_json(f"http://127.0.0.1:{port}/healthz") for port in INSTANCE_PORTS}

        probe_json = work / "probe.json"
        probe = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lipcast",
                "probe",
                FRONT_URL,
                "--sessions",
                str(sessions),
                "--duration-s",
                str(duration_s),
                "--ice-address",
                "127.0.0.1",
                "--json",
                str(probe_json),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # While every slot is taken, one more offer: each instance refuses it and nginx tries the next.
        full = wait_full(time.monotonic() + 60, probe) and asyncio.run(offer_when_full())
        probe_out, probe_err = probe.communicate(timeout=120)
        after = {port: get_json(f"http://127.0.0.1:{port}/healthz") for port in INSTANCE_PORTS}
        return {
            "full_offer": full or None,
            "probe_rc": probe.returncode,
            "probe_stdout": probe_out,
            "probe_stderr": probe_err[-3000:],
            "probe": json.loads(probe_json.read_text()) if probe_json.exists() else None,
            "instances": {
                str(port): {
                    "before": before[port],
                    "after": after[port],
                    "log": (work / f"instance-{port}.log").read_text(errors="replace"),
                }
                for port in INSTANCE_PORTS
            },
            "access_log": (work / "nginx.access.log").read_text(errors="replace").splitlines(),
        }
    finally:
        for proc in reversed(procs):  # nginx first (SIGQUIT: graceful), then the servers
            stop(proc, signal.SIGQUIT if proc.args[0] == nginx else signal.SIGTERM)
        for log in logs:
            with contextlib.suppress(OSError):
                log.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument(
        "--max-sessions",
        default="2,2",
        help="each instance's --max-sessions, comma-separated (unequal: offers spill over on 503)",
    )
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    capacities = tuple(int(x) for x in args.max_sessions.split(","))
    result = run(args.workdir, args.sessions, args.duration_s, capacities)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The Dockerfile and the Kubernetes manifests say what the deployment notes promise: a CUDA base, a non-root
user, the health check, the volumes; probes on /healthz and /readyz, a GPU, a preStop pause and a grace period
that covers the drain; settings that exist. hadolint runs when it is installed (`make lint-docker`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from lipcast.server.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"
PRESTOP_SLEEP_S = 5
# LIPCAST_* variables that are not one Settings field each (see lipcast.server.flags.settings_from).
LIST_VARIABLES = {
    "ICE_SERVERS",
    "ICE_ADDRESSES",
    "ICE_USERNAME",
    "ICE_CREDENTIAL",
    "AVATAR_DIRS",
    "BATCH_SIZES",
}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def is_setting(variable: str) -> bool:
    name = variable.removeprefix("LIPCAST_")
    return name.lower() in {f.name for f in fields(Settings)} or name in LIST_VARIABLES


def test_dockerfile_runs_lipcast_as_a_non_root_user_on_a_cuda_runtime_base() -> None:
    found = instructions()
    args = {k: [a for kk, a in found if kk == k] for k, _ in found}
    assert any("nvidia/cuda:" in a and "-runtime-" in a for a in args["ARG"]), args["ARG"]
    user = args["USER"][-1]
    assert re.fullmatch(r"\d+(:\d+)?", user) and int(user.split(":")[0]) != 0, user
    assert "/healthz" in args["HEALTHCHECK"][-1]
    assert '"/models"' in args["VOLUME"][-1] and '"/avatars"' in args["VOLUME"][-1]
    assert args["EXPOSE"] == ["8080"]
    assert args["CMD"][-1] == '["lipcast", "serve", "--host", "0.0.0.0"]'
    env = " ".join(args["ENV"])
    variables = re.findall(r"\b(LIPCAST_[A-Z_]+)=", env)
    assert variables and all(is_setting(v) for v in variables), variables


def hadolint() -> str | None:
    # the dev extra installs it beside this interpreter; `make lint-docker` in a tools venv of its own
    for installed in (
        Path(sys.executable).parent / "hadolint",
        ROOT / ".venv" / "deploy-tools" / "bin" / "hadolint",
    ):
        if installed.exists():
            return str(installed)
    return shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (make lint-docker installs it)")
def test_hadolint_finds_nothing() -> None:
    run = subprocess.run([str(hadolint()), str(DOCKERFILE)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def k8s_objects() -> dict[str, dict[str, Any]]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    objects = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                objects[f"{doc['kind']}/{doc.get('metadata', {}).get('name', path.name)}"] = doc
    return objects


def test_kubernetes_deployment_probes_gpu_and_drain() -> None:
    objects = k8s_objects()
    pod = objects["Deployment/lipcast"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", str(PRESTOP_SLEEP_S)]
    assert pod["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/models", "/avatars"} <= mounts

    config = objects["ConfigMap/lipcast-config"]["data"]
    assert all(is_setting(k) for k in config), config
    drain_s = float(config.get("LIPCAST_DRAIN_TIMEOUT_S", Settings().drain_timeout_s))
    assert pod["terminationGracePeriodSeconds"] >= PRESTOP_SLEEP_S + drain_s + 5

    service = objects["Service/lipcast"]["spec"]
    assert service["selector"].items() <= container_labels(objects).items()
    assert service["sessionAffinity"] == "ClientIP"


def container_labels(objects: dict[str, dict[str, Any]]) -> dict[str, str]:
    return dict(objects["Deployment/lipcast"]["spec"]["template"]["metadata"]["labels"])

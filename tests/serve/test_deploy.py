"""deploy/: the container build, its entrypoint and the Kubernetes manifests (issue 38).

The manifests are validated against Kubernetes 1.30's API schemas by `kubernetes-validate`
(PyPI, offline; scripts/test pins it), strictly (unknown fields refused); every flag they
and the entrypoint pass exists in the binary they run; the entrypoint serves a real model
as the container runs it. No container runtime is needed.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import REPO, loupe_bin, model_path

DEPLOY = REPO / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
VENV_BIN = Path(sys.executable).parent


def documents():
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def containers(kind_name: str):
    for _, doc in documents():
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == kind_name:
            return doc["spec"]["template"]["spec"]["containers"]
    raise AssertionError(f"no Deployment {kind_name} in deploy/k8s")


def validate(paths) -> subprocess.CompletedProcess:
    exe = VENV_BIN / "kubernetes-validate"
    assert exe.exists(), f"needs kubernetes-validate in {VENV_BIN} (scripts/test installs it)"
    return subprocess.run([str(exe), "--strict", "-k", "1.30.0", *map(str, paths)], capture_output=True, text=True)


def flags(args) -> set[str]:
    return {a.split("=")[0] for a in args if a.startswith("--")}


def test_manifests_validate_against_the_kubernetes_schemas(tmp_path):
    assert {p.name for p in MANIFESTS} >= {"namespace.yaml", "replicas.yaml", "router.yaml", "prometheus.yaml"}
    ok = validate(MANIFESTS)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The validator refuses what is wrong: a misspelt field and a port that is not a number.
    broken = tmp_path / "broken.yaml"
    broken.write_text((DEPLOY / "k8s" / "replicas.yaml").read_text().replace("containerPort: 8000", "containerPort: eight"))
    assert validate([broken]).returncode != 0
    broken.write_text((DEPLOY / "k8s" / "router.yaml").read_text().replace("serviceAccountName:", "serviceAcountName:"))
    assert validate([broken]).returncode != 0


def test_every_flag_the_manifests_pass_exists():
    serve_help = subprocess.run([str(loupe_bin()), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    entrypoint = (DEPLOY / "entrypoint.sh").read_text()
    used = flags(containers("loupe-replica")[0]["args"]) | set(re.findall(r"exec loupe serve (.*)", entrypoint)[0].split()) & {
        "--model", "--host", "--port"
    }
    missing = [f for f in sorted(used) if not re.search(rf"\s{re.escape(f)}[\s=<,]", serve_help)]
    assert not missing, f"loupe serve has no {missing}"
    smg = VENV_BIN / "smg"
    assert smg.exists(), f"needs smg in {VENV_BIN}"
    smg_help = subprocess.run([str(smg), "launch", "--help"], capture_output=True, text=True, check=True).stdout
    missing = [f for f in sorted(flags(containers("loupe-router")[0]["args"])) if f not in smg_help]
    assert not missing, f"smg launch has no {missing}"


def test_probes_ports_and_the_scrape_config_agree():
    replica = containers("loupe-replica")[0]
    port = replica["ports"][0]["containerPort"]
    assert "--port" not in replica["args"], "the entrypoint sets the port from LOUPE_PORT (8000)"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert replica[probe]["httpGet"]["path"] == "/health"
    for _, doc in documents():
        if doc["kind"] == "Deployment":
            spec = doc["spec"]["template"]
            assert spec["spec"]["securityContext"]["runAsNonRoot"] is True
            annotations = spec["metadata"]["annotations"]
            ports = {p["containerPort"] for c in spec["spec"]["containers"] for p in c["ports"]}
            assert int(annotations["prometheus.io/port"]) in ports
    assert port == 8000
    grace = next(d for _, d in documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "loupe-replica")
    shutdown = float(replica["args"][replica["args"].index("--shutdown-timeout") + 1])
    assert grace["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > shutdown
    config = next(d for _, d in documents() if d["kind"] == "ConfigMap")
    prometheus = yaml.safe_load(config["data"]["prometheus.yml"])
    job = prometheus["scrape_configs"][0]
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    assert any(r.get("action") == "keep" for r in job["relabel_configs"])


def test_dockerfile_stages_and_pins():
    text = (DEPLOY / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)", text, re.M)
    assert stages == ["build", "replica", "router"], stages
    for src in re.findall(r"^COPY (?!--from)(\S+) ", text, re.M):
        assert src == "." or (REPO / src).exists(), f"COPY {src}: no such path"
    assert re.search(r"^USER \d+", text, re.M), "the images run as an unprivileged user"
    rust = re.search(r"FROM rust:(\d+\.\d+)", text).group(1)
    wanted = re.search(r'rust-version = "(\d+\.\d+)"', (REPO / "Cargo.toml").read_text()).group(1)
    assert tuple(map(int, rust.split("."))) >= tuple(map(int, wanted.split("."))), (rust, wanted)
    pinned = re.search(r"sglang-router==(\S+)", (REPO / "scripts" / "test").read_text()).group(1)
    assert f"sglang-router=={pinned}" in text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def entrypoint(env: dict, *args: str) -> subprocess.Popen:
    path = f"{loupe_bin().parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.Popen(
        ["bash", str(DEPLOY / "entrypoint.sh"), *args],
        env={**os.environ, "PATH": path, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_entrypoint_serves_a_mounted_model_and_stops_cleanly():
    port = free_port()
    proc = entrypoint({"LOUPE_MODEL": str(model_path()), "LOUPE_PORT": str(port), "LOUPE_HOST": "127.0.0.1"}, "--threads", "1")
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("the entrypoint's server did not become ready in 60 s")
        info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
        assert info["served_model_name"] == model_path().stem
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "env,needle",
    [({}, "set LOUPE_MODEL"), ({"LOUPE_MODEL": "/nonexistent/model.gguf"}, "does not exist")],
)
def test_the_entrypoint_refuses_without_a_model(env, needle):
    clean = {"LOUPE_MODEL": "", "LOUPE_FETCH_MODEL": "", **env}
    proc = entrypoint(clean)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2 and needle in out, out


def test_entrypoint_syntax():
    subprocess.run(["bash", "-n", str(DEPLOY / "entrypoint.sh")], check=True)

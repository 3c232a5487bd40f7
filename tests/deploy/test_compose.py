"""The compose demo: its wiring agrees with the board image, and its host script really drives a board.

There is no Docker engine here, so the compose file is checked for what would
break the demo (the secret readable by the image's user, the volume at the
image's model store, the health check and port the image uses), and the host
container's script (deploy/docker/host-demo.sh) runs for real against a
daemon on loopback with a token, as it would against the board service.
"""
import os
import secrets
import subprocess
import sys

import pytest
import yaml

from deploy_helpers import COMPOSE, DEPLOY, DOCKERFILE, REPO, entry_command, flag_value, healthcheck, parse_dockerfile


def compose():
    return yaml.safe_load(COMPOSE.read_text())


def test_board_service_matches_the_image():
    doc = compose()
    board = doc["services"]["board"]
    final = parse_dockerfile(DOCKERFILE)[-1]
    entry = entry_command(final)
    assert (COMPOSE.parent / board["build"]["context"] / board["build"]["dockerfile"]).resolve() == DOCKERFILE
    # The token: an environment-sourced secret, copied in as the image's (non-root) user, 0400.
    uid, gid = final.last("USER").value.split(":")
    (secret,) = board["secrets"]
    assert doc["secrets"][secret["source"]].keys() == {"environment"}
    assert f"/run/secrets/{secret['target']}" == flag_value(entry, "--token-file")
    assert (secret["uid"], secret["gid"], secret["mode"]) == (uid, gid, 0o400)
    # Models persist in a named volume at the image's model store.
    volumes = {v.split(":")[1]: v.split(":")[0] for v in board["volumes"]}
    assert volumes[flag_value(entry, "--model-dir")] in doc["volumes"]
    # Published on the host's loopback only: the gRPC port and the metrics port.
    port = flag_value(entry, "--listen").rsplit(":", 1)[1]
    metrics_port = flag_value(board["command"], "--metrics-listen").rsplit(":", 1)[1]
    assert board["ports"] == [f"127.0.0.1:{port}:{port}", f"127.0.0.1:{metrics_port}:{metrics_port}"]
    # The same probe as the image's HEALTHCHECK.
    assert board["healthcheck"]["test"] == ["CMD", *healthcheck(final).argv]
    assert board["command"][0].startswith("--"), "command adds hrt_boardd flags after the ENTRYPOINT"


def test_host_service_waits_for_the_board_and_uses_the_token():
    doc = compose()
    host = doc["services"]["host"]
    entry = entry_command(parse_dockerfile(DOCKERFILE)[-1])
    assert host["depends_on"]["board"]["condition"] == "service_healthy"
    assert host["environment"]["BPUEMU_BOARD"] == f"board:{flag_value(entry, '--listen').rsplit(':', 1)[1]}"
    (secret,) = host["secrets"]
    assert host["environment"]["BPUEMU_TOKEN_FILE"] == f"/run/secrets/{secret['target']}"
    host_final = parse_dockerfile(COMPOSE.parent / host["build"]["context"] / host["build"]["dockerfile"])[-1]
    uid, gid = host_final.last("USER").value.split(":")
    assert (secret["uid"], secret["gid"], secret["mode"]) == (uid, gid, 0o400)
    assert "host-demo.sh" in " ".join(i.value for i in host_final.all("COPY"))


@pytest.mark.timeout(600)
def test_host_demo_script_drives_a_board(tmp_path):
    """host-demo.sh, as the host container runs it: model_info, infer, perf and hb_verifier against a token board."""
    board_tests = str(REPO / "tests" / "board")
    if board_tests not in sys.path:
        sys.path.append(board_tests)
    from boardd_harness import Daemon, clean_env

    token_file = tmp_path / "bpuemu_token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    daemon = Daemon(tmp_path / "board", "--token-file", str(token_file)).start()
    try:
        bindir = os.path.dirname(sys.executable)
        env = clean_env(BPUEMU_BOARD=daemon.target, BPUEMU_TOKEN_FILE=str(token_file), BPUEMU_WORKDIR=str(tmp_path / "work"),
                        BPUEMU_SIZE="16", BPUEMU_FRAMES="5", PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        proc = subprocess.run(["sh", str(DEPLOY / "docker" / "host-demo.sh")], capture_output=True, text=True, env=env,
                              timeout=540)
    finally:
        assert daemon.stop() == 0, daemon.log()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for step in ("hrt_model_exec model_info", "hrt_model_exec infer", "hrt_model_exec perf", "hb_verifier"):
        assert f"==> {step}" in out, step
    assert "infer success" in out
    assert "Arm VS Sim" in out and "Arm and Sim result Strict check PASSED" in out
    assert "all 3 comparison(s) PASSED" in out
    assert "Traceback" not in out

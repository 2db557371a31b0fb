"""The documented ``docker run ... sandbox`` recipe hangs together: the state directory is the
mount, the banner is told the host's side of it, and every port the banner's URLs name is
published on the same number. (No Docker daemon is needed: the recipe is read, not run.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gateway.sandbox.environment import HOST_STATE_DIR_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
IMAGE_PORT = "8080"  # deploy/Dockerfile: PORT=8080, the sandbox gateway's default
RECIPES = [ROOT / "deploy" / "README.md", ROOT / "README.md"]


def _sandbox_run(path: Path) -> list[str]:
    blocks = re.findall(r"^```sh\n(.*?)^```", path.read_text(encoding="utf-8"), re.S | re.M)
    runs = [
        line
        for block in blocks
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith("docker run") and " sandbox " in line
    ]
    assert len(runs) == 1, f"{path.name}: expected one `docker run ... sandbox` line, found {runs}"
    return shlex.split(runs[0])


def _values(words: list[str], flag: str) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word == flag]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docker_sandbox_recipe_mounts_its_state_and_publishes_its_ports(path: Path) -> None:
    words = _sandbox_run(path)
    [state_dir] = _values(words, "--state-dir")
    [mount] = _values(words, "-v")
    host_dir, _, inside = mount.rpartition(":")
    assert inside == state_dir
    assert f"{HOST_STATE_DIR_VARIABLE}={host_dir}" in _values(words, "-e")
    assert _values(words, "--host") == ["0.0.0.0"]
    assert _values(words, "--user"), "the container must write the mounted directory as the user"
    published = dict(p.split(":", 1) for p in _values(words, "-p"))
    assert all(outside == inside for outside, inside in published.items()), published
    [chain_port] = _values(words, "--chain-port")
    gateway_port = next(iter(_values(words, "--port")), IMAGE_PORT)
    assert {chain_port, gateway_port} <= set(published)

"""What a sandbox state directory keeps, and which port each part takes on a restart (in-process;
the restarts themselves are in test_sandbox_e2e.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gateway.sandbox.ports import PortChoice, check_free
from gateway.sandbox.state import CONFIG_FILE_NAME, SandboxConfig, read_config, save_config


def _config(version: int = 1) -> SandboxConfig:
    return SandboxConfig(
        version=version,
        host="127.0.0.1",
        gateway_port=8080,
        chain_port=41000,
        assets_port=41001,
        asset_api_key="k" * 32,
        internal_secret="s" * 43,
    )


def test_a_port_asked_for_wins_then_the_kept_one_then_the_default() -> None:
    assert PortChoice("the gateway", "--port", 9000, 8081, 8080).port == 9000
    assert PortChoice("the gateway", "--port", None, 8081, 8080).port == 8081
    assert PortChoice("the gateway", "--port", None, None, 8080).port == 8080
    assert PortChoice("the local chain", "--chain-port", None, None, 0).port == 0


def test_a_port_that_moved_is_said_once_bound() -> None:
    moved = PortChoice("the local chain", "--chain-port", 0, 41000, 0)
    assert moved.moved_note(41234) == (
        "the local chain moved from port 41000 to 41234 (--chain-port): "
        "commands printed by earlier runs name the old port"
    )
    assert PortChoice("the local chain", "--chain-port", None, 41000, 0).moved_note(41000) is None
    assert PortChoice("the local chain", "--chain-port", None, None, 0).moved_note(41234) is None


def test_a_taken_port_is_one_line_naming_the_part_and_how_to_move_it(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(OSError) as asked:
            check_free("127.0.0.1", PortChoice("the gateway", "--port", port, None, 8080), tmp_path)
        with pytest.raises(OSError) as kept:
            check_free("127.0.0.1", PortChoice("the gateway", "--port", None, port, 8080), tmp_path)
    assert str(asked.value) == (
        f"cannot listen on 127.0.0.1:{port}: Address already in use "
        "(the gateway's port; pass --port to use another)"
    )
    assert f"(the gateway's port, kept in {tmp_path} so that printed commands" in str(kept.value)
    assert "\n" not in str(kept.value)
    check_free("127.0.0.1", PortChoice("the gateway", "--port", port, None, 8080), tmp_path)  # free again


def test_the_config_is_kept_private_and_refused_when_unreadable(tmp_path: Path) -> None:
    assert read_config(tmp_path) is None
    save_config(tmp_path, _config())
    assert read_config(tmp_path) == _config()
    assert (tmp_path / CONFIG_FILE_NAME).stat().st_mode & 0o077 == 0
    save_config(tmp_path, _config(version=7))
    with pytest.raises(OSError, match="version 7, expected 1"):
        read_config(tmp_path)
    (tmp_path / CONFIG_FILE_NAME).write_text("{", encoding="utf-8")
    with pytest.raises(OSError, match=f"cannot read {tmp_path / CONFIG_FILE_NAME}"):
        read_config(tmp_path)

"""Start-up checks: model directories given as repositories, ports taken; the model table."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from naiad.cli.startup_checks import StartupError, check_ports, check_repositories
from naiad.cli.startup_report import load_summary, model_table
from naiad.config.server_config import ServerConfig


def test_version_folders_alone_mark_a_model_directory(tmp_path: Path) -> None:
    model = tmp_path / "my_model"
    (model / "1").mkdir(parents=True)
    with pytest.raises(StartupError, match=f"--model-repository {model} is a model directory .*version folder 1.* "
                       f"--model-repository {tmp_path}$"):
        check_repositories([str(model)])


def test_a_repository_and_remote_urls_pass(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    assert check_repositories([str(tmp_path), "s3://bucket/models"]) == []


def test_a_relative_model_directory_suggests_a_relative_parent(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.pbtxt").write_text('name: "m"')
    with pytest.raises(StartupError, match="e.g. --model-repository models$"):
        check_repositories(["models/m/"])


def test_a_taken_port_is_named_by_its_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = ServerConfig(http_address="127.0.0.1", http_port=0, grpc_address="127.0.0.1", grpc_port=port, metrics_port=0)
        with pytest.raises(StartupError, match=f"^--grpc-port {port} is in use"):
            check_ports(config)


def test_model_table_puts_each_reason_line_on_its_own_row() -> None:
    index = [{"name": "a", "version": "1", "state": "READY"},
             {"name": "b", "version": "2", "state": "UNAVAILABLE", "reason": "Internal: boom\n\nAt:\n  model.py(3): initialize\n"},
             {"name": "c"}]
    lines = model_table(index).splitlines()
    assert lines[1].split("|")[1:4] == [" Model ", " Version ", " Status                      "]
    assert lines[3].startswith("| a     | 1       | READY")
    assert lines[4].startswith("| b     | 2       | UNAVAILABLE: Internal: boom")
    assert lines[5].startswith("|       |         | At:")
    assert lines[6].startswith("|       |         |   model.py(3): initialize")
    assert not any(line.startswith("| c ") for line in lines)  # never asked for: not in the table
    assert load_summary(index) == "1 model ready, 1 failed (reasons in the table above)"


def test_a_version_directory_names_the_repository(tmp_path: Path) -> None:
    version = tmp_path / "models" / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(b"")
    with pytest.raises(StartupError, match=f"is a model version directory \\(it contains model.onnx\\).*"
                       f"--model-repository {tmp_path / 'models'}$"):
        check_repositories([str(version)])


def test_a_missing_relative_repository_says_relative_to_what(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StartupError, match=f"unable to read model repository 'nope': no such directory "
                       f"\\(relative to the current directory, {tmp_path}\\)"):
        check_repositories(["nope"])

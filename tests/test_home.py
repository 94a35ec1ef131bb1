"""Where local data goes (streamplatform/home.py): a team's project keeps its own, the
platform's install keeps none of it; the JVM jars stay the platform's."""

from __future__ import annotations

from streamplatform import home


def test_data_lands_in_the_folder_a_command_runs_in(tmp_path, monkeypatch):
    monkeypatch.delenv("STREAMPLATFORM_DATA", raising=False)
    monkeypatch.delenv("STREAMPLATFORM_HOME", raising=False)
    team = tmp_path / "team-project"
    team.mkdir()
    monkeypatch.chdir(team)
    assert home.data_dir() == team / ".data"
    assert home.default_state_dir() == team / ".data" / "state"
    assert home.jvm_dir("spark") == home._CHECKOUT / ".jvm" / "spark"  # the platform's jars
    monkeypatch.chdir(home._CHECKOUT / "docs")  # inside the platform's checkout: its own
    assert home.data_dir() == home._CHECKOUT / ".data"


def test_the_environment_moves_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STREAMPLATFORM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STREAMPLATFORM_DATA", raising=False)
    assert home.data_dir() == tmp_path / "home" / ".data"
    monkeypatch.setenv("STREAMPLATFORM_DATA", str(tmp_path / "elsewhere"))
    assert home.data_dir() == tmp_path / "elsewhere"

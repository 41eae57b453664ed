"""``rocev2-emu launch`` with a program that is not PyTorch: the environment each rank gets, the
rank prefix on its output, the first failing rank's exit code, and the refused command lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rocev2_emu.cli import main
from rocev2_emu.fabric.topogen import single_switch

pytestmark = pytest.mark.integration

SHOW = (
    "import os, sys; e = os.environ; "
    "print(e['RANK'], e['WORLD_SIZE'], e['LOCAL_RANK'], e['LOCAL_WORLD_SIZE'], e['ROCEV2_HOST'], "
    "e['MASTER_ADDR'], e['MASTER_PORT'].isdigit(), e['ROCEV2_STORE'].startswith('127.0.0.1:'), "
    "len(e['ROCEV2_EMU_SECRET']), e['OMP_NUM_THREADS']); "
    "sys.exit(3 if e['RANK'] == '1' else 0)"
)


@pytest.fixture
def topology(tmp_path: Path) -> Path:
    path = tmp_path / "three.toml"
    path.write_text(single_switch(3, tdf=1000))
    return path


def test_each_rank_gets_torchruns_environment_and_the_first_failure_is_the_exit_code(
    topology: Path,
) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocev2_emu",
            "launch",
            str(topology),
            "--",
            sys.executable,
            "-c",
            SHOW,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 3, run.stdout + run.stderr
    lines = sorted(line for line in run.stdout.splitlines() if line.startswith("[rank"))
    assert [line.split()[:6] for line in lines] == [
        [f"[rank{r}]:", str(r), "3", "0", "1", f"h{r}"] for r in range(3)
    ]
    assert all(line.split()[6:] == ["127.0.0.1", "True", "True", "64", "1"] for line in lines)
    assert "rank 1 (h1) exited with code 3" in run.stderr
    assert "# switches: 0 pause frames" in run.stdout  # the switches' summary at the end


def test_refused_command_lines(topology: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch", str(topology)]) == 1
    assert "no command; give it after --" in capsys.readouterr().err
    assert main(["launch", str(topology), "--ranks", "4", "--", "true"]) == 1
    assert "--ranks 4: from 1 to the topology's 3 hosts" in capsys.readouterr().err
    assert main(["demo", "--perftest", "--ui"]) == 1  # the map draws a fabric; perftest has none
    assert "--perftest has none" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # only launch takes a program after --
        main(["topology", "single-switch", "--hosts", "2", "--", "true"])
    assert "unrecognized arguments: -- true" in capsys.readouterr().err

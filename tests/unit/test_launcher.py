"""How a refusal is said under torchrun (``vitscale.launcher``), through the CLI in this process with
torchrun's environment and a real ``TCPStore`` standing in for its agent's: rank 0 prints it, writes
it into its error file and tells the others; another rank then exits with the same code and prints
nothing, or prints its own line when rank 0 says nothing in time. The real torchrun:
tests/distributed/test_torchrun_refusal.py."""

from __future__ import annotations

import json
import signal

import pytest

from vitscale import launcher
from vitscale.cli import main


@pytest.fixture
def torchrun_env(tmp_path, monkeypatch):
    """Rank ``r`` of a torchrun job whose agent store is a real TCPStore; SIGTERM's handler restored
    afterwards (a rank leaving with a refusal ignores it)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setattr(launcher, "WAIT_S", 0.5)
    monkeypatch.setattr(launcher, "LINGER_S", 0.1)
    for k, v in dict(TORCHELASTIC_RUN_ID="job", TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_USE_AGENT_STORE="True",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port)).items():  # fmt: skip
        monkeypatch.setenv(k, v)
    handler = signal.getsignal(signal.SIGTERM)

    def as_rank(r: int):
        monkeypatch.setenv("RANK", str(r))
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / f"error{r}.json"))
        return tmp_path / f"error{r}.json"

    yield as_rank
    signal.signal(signal.SIGTERM, handler)


def _reported(path) -> str:
    return json.loads(path.read_text())["message"]["message"]


def test_a_refusal_is_said_by_rank_0_once(torchrun_env, tmp_path, capsys):
    train = ["train", "digits_vit", "train.batch_size=0", f"train.output_dir={tmp_path / 'r'}"]
    # rank 1 first, rank 0 silent: after WAIT_S it says its own line, named
    err1 = torchrun_env(1)
    capsys.readouterr()
    assert main(train) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("vitscale train (rank 1): train.batch_size=0") and _reported(err1) == line
    # rank 0: prints it, its error file holds it (torchrun's root cause), the store says so
    err0 = torchrun_env(0)
    assert main(train) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("vitscale train: train.batch_size=0") and _reported(err0) == line
    # now rank 1 (train, eval, argparse's usage error): nothing printed, code 2, its error file points to rank 0
    torchrun_env(1)
    for argv in (train, ["eval", "no_such_config"], ["train", "--print-config"]):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
        assert rc == 2 and capsys.readouterr().err == "", argv
        assert _reported(err1) == "refused (exit code 2), as rank 0 says"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # leaving: torchrun's SIGTERM cannot make it -15
    assert not (tmp_path / "r").exists()


def test_another_error_is_said_by_its_rank(torchrun_env, tmp_path, capsys):
    err1 = torchrun_env(1)
    capsys.readouterr()
    assert main(["eval", "digits_vit", f"checkpoint.path={tmp_path / 'missing'}"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("vitscale eval (rank 1): ") and "\n" not in line and _reported(err1) == line

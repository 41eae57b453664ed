"""The fabric secret: where it lives and who may read it, where a node and a client find it, and
the handshake: the right proof is served, a late one is dropped (in virtual time), and the
client side is told why it was refused."""

from __future__ import annotations

import os
import pwd
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from rocev2_emu.control import auth
from rocev2_emu.control.channel import (
    AUTH_DEADLINE,
    DROPPED,
    ControlError,
    MessageChannel,
    prove_secret,
    serve_requests,
)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (auth.ENV, auth.ENV_FILE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    auth.use(None)


def dropped(reason: str) -> float:
    return float(DROPPED.labels(reason=reason)._value.get())


def test_up_makes_a_private_secret_that_clients_of_the_same_topology_find(tmp_path: Path) -> None:
    topo = str(tmp_path / "fabric.toml")
    assert auth.load(topo) is None
    secret, created = auth.load_or_create(topo)
    assert created is not None and created.parent == tmp_path / "run" / "rocev2-emu"
    assert stat.S_IMODE(created.stat().st_mode) == 0o600
    assert stat.S_IMODE(created.parent.stat().st_mode) == 0o700
    assert created.read_text() == f"ROCEV2_EMU_SECRET={secret.hex()}\n"  # an env_file too
    assert auth.load(topo) == secret  # a client (link, stop) finds it
    assert auth.load_or_create(topo) == (secret, None)  # a second node uses it, makes none
    other = str(tmp_path / "elsewhere" / "fabric.toml")  # the same name, another fabric
    assert auth.run_file(other) != created


def test_the_environment_wins_then_the_file_beside_the_topology(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo = str(tmp_path / "topology.toml")
    auth.load_or_create(topo)
    beside = auth.new()
    auth.write(tmp_path / "fabric.secret", beside)
    assert auth.load(topo) == beside  # the testbed's deploy/fabric.secret
    given = auth.new()
    monkeypatch.setenv(auth.ENV, given.hex())
    assert auth.load(topo) == given
    assert auth.current() == given


def test_a_secret_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fabric.secret"
    auth.write(path, auth.new())
    os.chmod(path, 0o644)
    with pytest.raises(auth.AuthError, match="must be private"):
        auth.read(path)
    with pytest.raises(auth.AuthError, match="not a fabric secret"):
        auth.parse("ROCEV2_EMU_SECRET=abc", "x")


def test_ensure_makes_a_secret_file_once_and_share_copies_it(tmp_path: Path) -> None:
    path = tmp_path / "deploy" / auth.BESIDE_TOPOLOGY
    path.parent.mkdir()
    made, created = auth.ensure(path)
    assert created and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.ensure(path) == (made, False)  # kept, not replaced
    copy = tmp_path / "volume" / "fabric.secret"
    copy.parent.mkdir()
    auth.share(made, copy, os.getuid(), os.getgid())
    assert auth.read(copy) == made and stat.S_IMODE(copy.stat().st_mode) == 0o600
    path.chmod(0o644)
    with pytest.raises(auth.AuthError, match="must be private"):
        auth.ensure(path)  # a file others can read is refused, not trusted


def test_a_reader_never_sees_a_secret_file_half_written(tmp_path: Path) -> None:
    """A container's node reads the shared copy while the secret service may write it again
    (a compose ``up`` of more services reruns it): every read is a whole secret."""
    path = tmp_path / "volume" / "fabric.secret"
    path.parent.mkdir()
    auth.write(path, auth.new())
    stop = threading.Event()
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                auth.read(path)
            except auth.AuthError as exc:
                bad.append(str(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(300):
            auth.share(auth.new(), path, os.getuid(), os.getgid())
    finally:
        stop.set()
        thread.join()
    assert bad == []
    assert [p.name for p in path.parent.iterdir()] == ["fabric.secret"]  # nothing beside it
    with pytest.raises(FileExistsError):
        auth.write(path, auth.new(), exclusive=True)
    assert [p.name for p in path.parent.iterdir()] == ["fabric.secret"]


def test_the_secret_command_makes_shares_and_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rocev2_emu.cli import main

    path, copy = tmp_path / auth.BESIDE_TOPOLOGY, tmp_path / "copy.secret"
    me = pwd.getpwuid(os.getuid()).pw_name
    assert main(["secret", str(path), "--share", str(copy), "--user", me]) == 0
    assert capsys.readouterr().out == f"fabric secret: made {path}, shared at {copy} for {me}\n"
    assert auth.read(copy) == auth.read(path)
    assert main(["secret", str(path)]) == 0
    assert capsys.readouterr().out == f"fabric secret: kept {path}\n"
    assert main(["secret", str(path), "--share", str(copy), "--user", "no-such-user-x"]) == 1
    assert capsys.readouterr().err == "rocev2-emu secret: --user no-such-user-x: no such user\n"


def test_a_run_directory_others_can_enter_is_refused(tmp_path: Path) -> None:
    os.chmod(tmp_path / "run", 0o755)
    (tmp_path / "run" / "rocev2-emu").mkdir(mode=0o777)
    os.chmod(tmp_path / "run" / "rocev2-emu", 0o777)  # past the umask
    with pytest.raises(auth.AuthError, match="others can enter it"):
        auth.run_dir()


def test_a_client_with_no_secret_says_where_it_looked(tmp_path: Path) -> None:
    topo = str(tmp_path / "fabric.toml")
    with pytest.raises(auth.AuthError, match="is the fabric running") as info:
        auth.use_fabric(topo)
    assert str(tmp_path / "fabric.secret") in str(info.value)
    with pytest.raises(auth.AuthError, match="no fabric secret"):
        auth.current()


async def echo(msg: Any) -> Any:
    return {"echo": msg}


def run(main: Any) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_right_proof_is_served_and_a_late_one_dropped_at_the_deadline() -> None:
    secret = auth.new()
    before = dropped("auth_failed")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server, client = trio.testing.memory_stream_pair()
            nursery.start_soon(serve_requests, server, echo, 3600.0, 30.0, secret)
            chan = MessageChannel(client, timeout=60.0)
            await prove_secret(chan, secret, "test")
            await chan.send("hello")
            assert await chan.recv() == {"echo": "hello"}
            await chan.aclose()

            server, client = trio.testing.memory_stream_pair()
            nursery.start_soon(serve_requests, server, echo, 3600.0, 30.0, secret)
            chan = MessageChannel(client, timeout=60.0)
            assert "challenge" in await chan.recv()
            start = trio.current_time()
            with pytest.raises(ControlError, match="closed"):
                await chan.recv()  # never answered: the server hangs up
            assert trio.current_time() - start == AUTH_DEADLINE

            server, client = trio.testing.memory_stream_pair()
            nursery.start_soon(serve_requests, server, echo, 3600.0, 30.0, secret)
            with pytest.raises(ControlError, match=r"refused this client.*authentication failed"):
                await prove_secret(MessageChannel(client, timeout=60.0), auth.new(), "test")

    run(main)
    assert dropped("auth_failed") == before + 2


def test_a_client_talking_to_a_server_that_sets_no_challenge_is_told() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server, client = trio.testing.memory_stream_pair()
            nursery.start_soon(serve_requests, server, echo)  # no secret: answers at once
            chan = MessageChannel(client, timeout=60.0)
            await chan.send("hi")  # what a peer that is no fabric node might say first
            with pytest.raises(ControlError, match="did not open with a challenge"):
                await prove_secret(chan, auth.new(), "test")
            nursery.cancel_scope.cancel()

    run(main)

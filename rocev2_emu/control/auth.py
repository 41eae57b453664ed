"""The fabric secret, and how a control connection proves it holds it.

Every fabric of processes has one secret of 32 random bytes (:func:`secrets.token_bytes`).
``rocev2-emu up`` (and a node started by hand) makes one when the fabric has none, in a
private run directory; ``rocev2-emu compose`` writes one next to the testbed's topology.  A
node gets it through its environment (``ROCEV2_EMU_SECRET``), never on a command line that
``ps`` shows; a client finds it the same way a node does (:func:`load`):

1. ``ROCEV2_EMU_SECRET`` (hex) or ``ROCEV2_EMU_SECRET_FILE`` (a file) in the environment;
2. ``fabric.secret`` in the topology file's directory (the compose testbed's ``deploy/``);
3. the run directory's file for that topology (``$XDG_RUNTIME_DIR/rocev2-emu`` or
   ``/tmp/rocev2-emu-<uid>``, mode 0700; ``<stem>-<hash of the path>.secret``, mode 0600).

A secret file is one line, ``ROCEV2_EMU_SECRET=<64 hex digits>``: the format of a compose
``env_file``, so the same file feeds the containers.

The handshake (:func:`challenge_message` and :func:`check_answer` on the server,
:func:`answer_message` on the client; :mod:`rocev2_emu.control.channel` runs it) opens every
control connection: the server sends 32 fresh random bytes, the client answers with their
HMAC-SHA256 under the secret (RFC 2104, with a label naming the protocol), the server compares
in constant time (:func:`hmac.compare_digest`) and says ``ok`` or closes.  Nothing secret
crosses the wire, and a recorded answer is worth nothing on the next connection.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any, Final

ENV: Final = "ROCEV2_EMU_SECRET"
ENV_FILE: Final = "ROCEV2_EMU_SECRET_FILE"
BESIDE_TOPOLOGY: Final = "fabric.secret"
SECRET_BYTES: Final = 32
_LABEL: Final = b"rocev2-emu control v1\0"

_current: bytes | None = None  # this process's fabric secret (one fabric per process)


class AuthError(RuntimeError):
    """No secret where one is needed, a secret file that is not private, or a failed proof."""


def new() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def use(secret: bytes | None) -> None:
    """Make ``secret`` the one this process's control servers demand and its clients prove
    (None: forget it, and look in the environment again)."""
    global _current
    if secret is not None and len(secret) != SECRET_BYTES:
        raise AuthError(f"a fabric secret is {SECRET_BYTES} bytes, not {len(secret)}")
    _current = secret


def current() -> bytes:
    """This process's fabric secret: the one :func:`use` set, else the environment's."""
    if _current is None:
        found = from_env()
        if found is None:
            raise AuthError(
                f"no fabric secret: set {ENV} or {ENV_FILE}, or run this through the fabric's "
                "own commands (rocev2-emu up / node / link / stop / bench --attach find it "
                "from the topology file; docs/security.md)"
            )
        use(found)
    assert _current is not None
    return _current


def parse(text: str, where: str) -> bytes:
    """The secret in a secret file's text (``ROCEV2_EMU_SECRET=<hex>``, or the hex alone)."""
    value = text.strip()
    if value.startswith(ENV + "="):
        value = value[len(ENV) + 1 :]
    try:
        secret = bytes.fromhex(value)
    except ValueError:
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise AuthError(f"{where}: not a fabric secret ({ENV}=<{2 * SECRET_BYTES} hex digits>)")
    return secret


def read(path: Path) -> bytes:
    """A secret file's secret; the file must be readable by its owner only."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthError(f"{path}: a secret file must be private (chmod 600), is {mode & 0o777:o}")
    return parse(path.read_text(), str(path))


def write(
    path: Path, secret: bytes, *, exclusive: bool = False, owner: tuple[int, int] | None = None
) -> None:
    """Write ``secret`` to ``path``, mode 0600 from its creation on, whole or not at all: it is
    written beside ``path`` and then renamed over it (``exclusive``: linked, which fails if
    the file exists), so a reader sees the old file or the new one, never a part of one (a
    container's node reading the copy its secret service writes again).  ``owner``: (uid,
    gid) the file belongs to from the start (root only)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(f"{ENV}={secret.hex()}\n")
            if owner is not None:
                os.fchown(f.fileno(), *owner)
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def ensure(path: Path) -> tuple[bytes, bool]:
    """The secret in ``path``, made there if the file does not exist (owned by whoever owns
    its directory, so that a file a container makes in a bind-mounted directory belongs to the
    user who mounted it): (secret, whether it was made)."""
    try:
        return read(path), False
    except FileNotFoundError:
        pass
    secret = new()
    dir_owner = path.parent.stat()
    owner = (dir_owner.st_uid, dir_owner.st_gid)
    try:
        write(path, secret, exclusive=True, owner=owner if os.geteuid() == 0 else None)
    except FileExistsError:  # made a moment ago by someone else
        return read(path), False
    return secret, True


def share(secret: bytes, path: Path, uid: int, gid: int) -> None:
    """Write ``secret`` to ``path`` (mode 0600) for the user ``uid``: the copy a container's
    unprivileged user reads through ``ROCEV2_EMU_SECRET_FILE``."""
    write(path, secret, owner=(uid, gid) if os.geteuid() == 0 else None)


def from_env() -> bytes | None:
    if value := os.environ.get(ENV):
        return parse(value, f"${ENV}")
    if path := os.environ.get(ENV_FILE):
        try:
            return read(Path(path))
        except OSError as exc:
            raise AuthError(f"${ENV_FILE}: cannot read {path}: {exc.strerror}") from exc
    return None


def run_dir() -> Path:
    """This user's private run directory (created 0700; refused if anyone else can enter)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = (
        Path(base, "rocev2-emu")
        if base
        else Path(tempfile.gettempdir(), f"rocev2-emu-{os.getuid()}")
    )
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise AuthError(f"{path}: not a directory of this user's; remove it")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthError(f"{path}: others can enter it (mode {info.st_mode & 0o777:o}); chmod 700")
    return path


def run_file(topology_path: str) -> Path:
    """The run directory's secret file for the fabric of ``topology_path``."""
    resolved = str(Path(topology_path).resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
    return run_dir() / f"{Path(topology_path).stem}-{digest}.secret"


def load(topology_path: str) -> bytes | None:
    """The secret of the fabric of ``topology_path``, where a node would find it (the module's
    docstring lists the places, first match wins); None if there is none yet."""
    found = from_env()
    if found is not None:
        return found
    for path in (Path(topology_path).with_name(BESIDE_TOPOLOGY), run_file(topology_path)):
        if path.exists():
            return read(path)
    return None


def use_fabric(topology_path: str) -> None:
    """Use the secret of the running fabric of ``topology_path`` (a client's commands: link,
    stop, an attached bench); an error naming where it looked when there is none."""
    found = load(topology_path)
    if found is None:
        raise AuthError(
            f"no secret for the fabric of {topology_path}: none in ${ENV}, ${ENV_FILE}, "
            f"{Path(topology_path).with_name(BESIDE_TOPOLOGY)} or {run_file(topology_path)} "
            "- is the fabric running (rocev2-emu up, or the testbed)?"
        )
    use(found)


def load_or_create(topology_path: str) -> tuple[bytes, Path | None]:
    """The fabric's secret, made in the run directory if it has none: (secret, the file
    created, or None when the secret existed)."""
    found = load(topology_path)
    if found is not None:
        return found, None
    path, secret = run_file(topology_path), new()
    try:
        write(path, secret, exclusive=True)
    except FileExistsError:  # another node of the same fabric made it a moment ago
        return read(path), None
    return secret, path


def proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, _LABEL + nonce, hashlib.sha256).digest()


def challenge_message() -> tuple[dict[str, Any], bytes]:
    nonce = secrets.token_bytes(32)
    return {"auth": "hmac-sha256", "challenge": nonce}, nonce


def check_answer(secret: bytes, nonce: bytes, answer: Any) -> bool:
    got = answer.get("proof") if isinstance(answer, dict) else None
    return isinstance(got, bytes) and hmac.compare_digest(got, proof(secret, nonce))


def answer_message(secret: bytes, challenge: Any) -> dict[str, Any]:
    """The client's answer to a server's challenge message."""
    nonce = challenge.get("challenge") if isinstance(challenge, dict) else None
    if not isinstance(nonce, bytes) or challenge.get("auth") != "hmac-sha256":
        raise AuthError(f"the server did not open with a challenge: {challenge!r:.120}")
    return {"proof": proof(secret, nonce)}

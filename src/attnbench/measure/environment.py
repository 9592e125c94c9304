"""What the run ran on: versions, device and CPU names, threads, driver, git commit."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import urllib.parse
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def attnbench_version() -> str:
    """attnbench's version, as pyproject.toml states it (read from the installed package's metadata, the one
    place it is written); ``0+unknown`` when the package is imported without being installed."""
    try:
        return metadata.version("attnbench")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _checkout(package: Path | None = None) -> Path | None:
    """The git checkout attnbench's code comes from: the one it is imported from (editable install: its
    ``src/attnbench``; a plain install in a project's ``.venv`` lies in that project's repository, not in
    attnbench's), else the working directory when that is an attnbench checkout (a plain install made from it, as
    nox does)."""
    here = package or Path(__file__).resolve().parents[1]  # the package: …/attnbench
    top = _run(["git", "rev-parse", "--show-toplevel"], cwd=here)
    if top is not None and Path(top).resolve() / "src" / "attnbench" == here:  # not a project's .venv around it
        return here
    pyproject = Path.cwd() / "pyproject.toml"
    if pyproject.is_file() and 'name = "attnbench"' in pyproject.read_text():
        return Path.cwd()
    return None


def _git_state(where: Path) -> tuple[str | None, bool | None]:
    """HEAD of the repository at ``where`` and whether its tracked files changed (untracked ones, such as run
    folders, do not count); (None, None) outside a git repository."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=where)
    if commit is None:
        return None, None
    return commit, _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where) is not None


def attnbench_git() -> dict[str, Any]:
    """attnbench's own git state: ``git_commit`` and ``git_dirty`` (its tracked files changed since that commit:
    a run of edited code is not filed as the commit's). Both None where attnbench is no checkout's."""
    checkout = _checkout()
    commit, dirty = _git_state(checkout) if checkout else (None, None)
    return {"git_commit": commit, "git_dirty": dirty}


def workdir_git(path: Path | None = None) -> dict[str, Any]:
    """The git state of the folder attnbench runs in (the code under test when a kernel's repository runs
    it): ``workdir_commit`` (HEAD) and ``workdir_dirty`` (tracked files changed; untracked ones, such as
    run folders, do not count). Both None outside a git repository. ``attnbench store`` files a run under
    this commit, falling back to ``git_commit`` and ``git_dirty``."""
    commit, dirty = _git_state(path or Path.cwd())
    return {"workdir_commit": commit, "workdir_dirty": dirty}


PLUGIN_GROUP = "attnbench.impls"  # the contenders' entry-point group (attnbench.contenders.registry.GROUP)


def plugins() -> dict[str, str]:
    """The installed distributions besides attnbench that add contenders (entry points in ``attnbench.impls``), by
    name: their version, and where one is installed editable from a git checkout, `` at COMMIT`` (12 characters)
    with ``+edits`` when its tracked files changed — the version of a kernel author's contender that a run timed,
    which attnbench's own commit does not say."""
    found: dict[str, str] = {}
    for entry_point in metadata.entry_points(group=PLUGIN_GROUP):
        dist = entry_point.dist
        if dist is None or dist.name == "attnbench" or dist.name in found:
            continue
        found[dist.name] = dist.version + _editable_commit(dist)
    return dict(sorted(found.items()))


def _editable_commit(dist: metadata.Distribution) -> str:
    """`` at COMMIT`` (``+edits``) of an editable install's git checkout (PEP 610's direct_url.json); else ''."""
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return ""
    if not isinstance(direct, dict) or not (direct.get("dir_info") or {}).get("editable"):
        return ""
    url = str(direct.get("url", ""))
    if not url.startswith("file://"):
        return ""
    commit, dirty = _git_state(Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)))
    return f" at {commit[:12]}{'+edits' if dirty else ''}" if commit else ""


def nvidia_driver() -> str | None:
    if not torch.cuda.is_available():
        return None
    return _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])


def environment(threads: int | None = None) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return {
        "attnbench_version": attnbench_version(),
        **attnbench_git(),
        **workdir_git(),
        "plugins": plugins(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "nvidia_driver": nvidia_driver(),
        "hostname": platform.node(),
        "cpu_name": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": threads if threads is not None else torch.get_num_threads(),
    }


def command_line(argv: list[str]) -> str:
    """The command as a user would retype it: `attnbench` and the arguments given."""
    return shlex.join(["attnbench", *argv])

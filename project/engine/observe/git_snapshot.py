"""A checkout's git state for a run's record: its commit, and when its tree is dirty the uncommitted diff as a patch
that ``git apply`` reproduces on that commit (tracked changes, then the untracked source and config files; never a
file whose name looks like a secret, since run directories get uploaded and shared)."""

import fnmatch
import subprocess
from pathlib import Path
from typing import Any

# Untracked files copied into the patch: source and config only, small, and never one whose name looks like a
# secret (run directories get uploaded and shared: a tracker, a shared disk, a bug report). The others are listed
# in the record by name and size.
UNTRACKED_MAX_BYTES = 1_000_000
SOURCE_SUFFIXES = {
    ".py",
    ".pyi",
    ".yaml",
    ".yml",
    ".toml",
    ".cfg",
    ".ini",
    ".json",
    ".md",
    ".txt",
    ".rst",
    ".sh",
    ".sbatch",
    ".ipynb",
}
SOURCE_NAMES = {"Makefile", "Dockerfile"}
SECRET_NAMES = (
    ".env*",
    "*.pem",
    "*.key",
    "id_*",
    "*token*",
    "*secret*",
    "credentials*",
    "*.p12",
    "*.pfx",
    ".netrc",
    ".pgpass",
    "*.kdbx",
    "*password*",
)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)


def git_state(repo: Path, patch_path: Path) -> dict[str, Any]:
    """The commit of ``repo``, whether its tree is dirty, and if so the uncommitted diff written to ``patch_path``
    (tracked changes, then untracked files not ignored by .gitignore, as new files)."""
    try:  # one call: the commit, the branch and every change (git >= 2.11)
        status = _git(repo, "status", "--porcelain=v2", "--branch")
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"commit": None, "note": f"git is not available ({err.__class__.__name__})"}
    lines = status.stdout.splitlines()
    headers = dict(line[2:].partition(" ")[::2] for line in lines if line.startswith("# "))
    if status.returncode != 0 or headers.get("branch.oid", "(initial)") == "(initial)":
        return {"commit": None, "note": f"{repo} is not a git checkout: no commit recorded"}
    dirty = any(not line.startswith("# ") for line in lines)
    state: dict[str, Any] = {"commit": headers["branch.oid"], "dirty": dirty, "branch": headers.get("branch.head")}
    if not state["dirty"]:
        return state
    patch = _git(repo, "diff", "HEAD", "--binary").stdout
    skipped = []
    untracked = _git(repo, "ls-files", "--others", "--exclude-standard", "-z").stdout.split("\0")
    for name in filter(None, untracked):
        reason = _not_copied(repo / name)
        if reason:
            skipped.append({"name": name, "bytes": (repo / name).stat().st_size, "why": reason})
            continue
        # --no-index exits 1 when the files differ, which is the point here.
        patch += _git(repo, "diff", "--no-index", "--binary", "--", "/dev/null", name).stdout
    patch_path.write_text(patch)
    state["patch"] = patch_path.name
    if skipped:
        state["untracked_not_in_patch"] = skipped
    return state


def _not_copied(path: Path) -> str | None:
    """Why an untracked file stays out of the patch, or None to copy it."""
    if any(fnmatch.fnmatch(path.name.lower(), pattern) for pattern in SECRET_NAMES):
        return "its name looks like a secret"
    if path.suffix.lower() not in SOURCE_SUFFIXES and path.name not in SOURCE_NAMES:
        return "not a source or config file"
    if path.stat().st_size > UNTRACKED_MAX_BYTES:
        return f"over {UNTRACKED_MAX_BYTES // 1_000_000} MB"
    return None

"""The folder a report-like command writes (``report``, ``compare``, ``history``): new, empty, or that command's own
earlier output, which is cleared first — a figure the new data does not draw must not stay beside the new page."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from attnbench.errors import UsageError, check_can_make
from attnbench.runner.results import write_text


class _Claim(NamedTuple):
    out_dir: Path
    page: str
    patterns: tuple[str, ...]
    made: bool  # the folder did not exist: the command makes it
    earlier: tuple[int, int, int] | None  # the earlier page's inode, size and mtime: a page the command has not written


_CLAIMS: list[_Claim] = []  # the folders the command in hand is writing a page into


def claim_report_folder(out_dir: Path, page: str, patterns: tuple[str, ...]) -> None:
    """Make ``out_dir`` ready for a page named ``page`` and its files (``patterns``, globs in the folder): a new or
    empty folder is used as it is; one holding an earlier ``page`` has its other files matching ``patterns`` removed
    (the page stays until the new one replaces it: it embeds its figures, so it is whole without them); any other
    folder with files in it is a UsageError (nothing is removed or written). The claim is kept until the command
    ends (:func:`forget_claims`) or is cut short (:func:`remove_unfinished_pages`)."""
    check_can_make(out_dir, "--out")
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a folder; choose a new one")
    entries = list(out_dir.iterdir()) if out_dir.exists() else []
    if entries and not (out_dir / page).is_file():
        raise UsageError(
            f"--out {out_dir}: already holds files and no earlier {page} (e.g. {entries[0].name}); choose a new or "
            "empty folder"
        )
    earlier = _identity(out_dir / page) if entries else None
    _CLAIMS.append(_Claim(out_dir, page, patterns, made=not out_dir.exists(), earlier=earlier))
    _remove(out_dir, patterns, keep=out_dir / page)


def _identity(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def _remove(out_dir: Path, patterns: tuple[str, ...], keep: Path | None = None) -> None:
    for pattern in patterns:
        for path in out_dir.glob(pattern):
            if path.is_file() and path != keep:
                path.unlink()


def remove_unfinished_pages() -> list[str]:
    """For a command that did not finish (Ctrl-C, an error): remove the files its claimed folders got so far — a
    page's figures without it, or half a page, would pass for a whole one — but an earlier page it had not yet
    replaced, and a folder it made; returns a note for each folder where that earlier page stands."""
    notes = []
    while _CLAIMS:
        claim = _CLAIMS.pop()
        if not claim.out_dir.is_dir():
            continue
        page = claim.out_dir / claim.page
        kept = claim.earlier is not None and page.is_file() and _identity(page) == claim.earlier
        _remove(claim.out_dir, claim.patterns, keep=page if kept else None)
        if kept:
            notes.append(f"the earlier {claim.page} in {claim.out_dir} stands (its other files were cleared)")
        if claim.made and not any(claim.out_dir.iterdir()):
            claim.out_dir.rmdir()
    return notes


def write_page(path: Path, html: str) -> Path:
    """Write a claimed folder's page whole (one rename) and end the folder's claim: from here its files are the
    command's output, whatever happens after — a reader that closed the pipe while the command still printed once
    had the finished report, and the earlier one, removed as unfinished."""
    write_text(path, html)
    _CLAIMS[:] = [claim for claim in _CLAIMS if claim.out_dir.resolve() != path.parent.resolve()]
    return path


def forget_claims() -> None:
    """The command ended having written what it claimed: its folders are no longer unfinished."""
    _CLAIMS.clear()

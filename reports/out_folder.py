"""The folder a report-like command writes (``report``, ``compare``, ``history``): new, empty, or that command's own
earlier output, which is cleared first — a figure the new data does not draw must not stay beside the new page."""

from __future__ import annotations

from pathlib import Path

from attnbench.errors import UsageError, check_can_make


def claim_report_folder(out_dir: Path, page: str, patterns: tuple[str, ...]) -> None:
    """Make ``out_dir`` ready for a page named ``page`` and its files (``patterns``, globs in the folder): a new or
    empty folder is used as it is; one holding an earlier ``page`` has its files matching ``patterns`` removed; any
    other folder with files in it is a UsageError (nothing is removed or written)."""
    check_can_make(out_dir, "--out")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: exists and is not a folder; choose a new one")
    entries = list(out_dir.iterdir())
    if not entries:
        return
    if not (out_dir / page).is_file():
        raise UsageError(
            f"--out {out_dir}: already holds files and no earlier {page} (e.g. {entries[0].name}); choose a new or "
            "empty folder"
        )
    for pattern in patterns:
        for path in out_dir.glob(pattern):
            if path.is_file():
                path.unlink()

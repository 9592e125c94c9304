"""``attnbench run --fail-on STATUSES``: a run whose rows include one of these statuses exits 1.

Without it `run` exits 0 whatever its rows say (a row is a result, not a failure of the command); a CI job
that wants a wrong kernel to fail its build says which statuses fail it: ``--fail-on incorrect,error``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.errors import UsageError
from attnbench.runner.results import STATUSES

if TYPE_CHECKING:
    import pandas as pd

FAILABLE = tuple(status for status in STATUSES if status != "ok")


def parse_fail_on(text: str | None) -> tuple[str, ...]:
    """The statuses named, checked: one line naming what is allowed when one is not a row status."""
    if text is None:
        return ()
    named = [part.strip() for part in text.split(",")]
    unknown = [name for name in named if name not in FAILABLE]
    if unknown:
        allowed = ", ".join(FAILABLE)
        raise UsageError(
            f"--fail-on {text!r}: {', '.join(map(repr, unknown))} is not a row status; choose from {allowed}"
        )
    return tuple(dict.fromkeys(named))


def failure_line(frame: pd.DataFrame, statuses: tuple[str, ...]) -> str | None:
    """What failed the run, each status with its count and contenders; None when no row has one of them."""
    if not statuses or frame.empty:
        return None
    parts = []
    for status in statuses:
        rows = frame[frame["status"] == status]
        if len(rows):
            counts = rows["impl"].value_counts()
            impls = ", ".join(f"{impl} ×{n}" if n > 1 else str(impl) for impl, n in counts.items())
            parts.append(f"{len(rows)} {status} ({impls})")
    if not parts:
        return None
    return f"failed (--fail-on {','.join(statuses)}): {'; '.join(parts)}"

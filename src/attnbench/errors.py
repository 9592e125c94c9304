"""Errors a user can cause, and how any exception becomes a row's one-line reason.

A UsageError is printed by the CLI as one line, with exit code 2.

:func:`reason` is the one way an exception becomes the reason of an ``error``/``unavailable``/``unsupported``
row (and of a contender that failed to load): a library's first line rarely says why — xformers' is "No
operator found for `memory_efficient_attention_forward` with inputs:", the why ("`cutlassF-pt` is not
supported because: xFormers wasn't build with CUDA support") is lines further down. So the reason keeps the
lines that follow, without the noise (torch's "(Triggered internally at …/file.cpp:NNN.)", C++ frames and
Python traceback lines, file:line paths, a dump of the inputs' fields that the row's own columns already
hold, blank and repeated lines), joined into one line with "; " — a line that ends with ":" runs on into the
next, so "not supported because: <why>" stays one clause — and capped at :data:`REASON_CHARS` with "…".
"""

from __future__ import annotations

import os
import re
import tempfile
import traceback
from pathlib import Path

REASON_CHARS = 360  # a reason's cap: room for a library's headline and two or three of its "because" clauses


class UsageError(ValueError):
    """Bad input: the message names the field, the value and what is allowed."""


def refuse_empty(flag: str, text: object, example: str) -> None:
    """A UsageError for a flag given an empty value (``--out ''``): it would quietly be the default, or the current
    folder; ``example`` is a value that would do."""
    if isinstance(text, str) and not text.strip():
        raise UsageError(f"{flag} '': no value; give one, e.g. {flag} {example}, or drop {flag} for its default")


def check_can_make(path: Path, flag: str) -> None:
    """A UsageError unless ``path`` (a folder or file to write, given by ``flag``) can be written: an existing
    folder this process may write in, or a new one whose nearest existing parent is such a folder. An ``--out``
    under a file or a read-only folder then fails in one line before any work, not at its first write."""
    above = path if path.exists() else next(parent for parent in path.absolute().parents if parent.exists())
    if not above.is_dir():
        if above != path:
            raise UsageError(f"{flag} {path}: {above} is a file, not a folder; give a path under folders")
        return  # the path itself is a file: the caller says whether that will do
    if not os.access(above, os.W_OK | os.X_OK) or not _can_make_in(above):
        raise UsageError(f"{flag} {path}: {above} is not writable; give a folder you can write in")


def _can_make_in(folder: Path) -> bool:
    """Whether a folder can be made in ``folder``, tried: root passes every permission check (os.access) yet
    cannot write in /proc or on a read-only mount."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".attnbench-probe-", dir=folder))
    except OSError:
        return False
    return True


_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?")
# a source location ("/pytorch/aten/src/ATen/native/foo.cpp:986", "kernel.py:12:4"), with the "at"/"in"/"from"
# before it and parentheses around it
_LOCATION = re.compile(
    r"\s*\(?(?:\b(?:at|in|from)\s+)?(?<![\w.])(?:[A-Za-z]:)?[\w./\\+-]*"
    r"\.(?:py|pyx|c|cc|cpp|cxx|cu|cuh|h|hpp):\d+(?::\d+)?\)?:?"
)
_FRAME = re.compile(r'^File ".*", line \d+')  # a Python traceback's frame
_NOISE_LINES = (
    re.compile(r"^Traceback \(most recent call last\):$"),
    _FRAME,
    re.compile(r"^frame #\d+:"),  # a C++ backtrace's frame (torch's c10::Error)
    re.compile(r"^Exception raised from .*\(most recent call first\):$"),
    re.compile(r"^[~^]+$"),  # a traceback's caret line
    re.compile(r"^\w+ {2,}: "),  # an aligned dump of fields ("query       : shape=(…) (torch.float16)")
)


def reason(exc: BaseException, limit: int = REASON_CHARS, code: str | None = None) -> str:
    """``Type: message`` of ``exc`` as one line: its first line and the lines that explain it (see the module
    docstring), at most ``limit`` characters. An exception without a message is its type's name. Given ``code``,
    the module that defines a contender, the reason ends with where in that contender's own code the exception
    was raised or passed through last (:func:`raised_in`): file:line paths are noise inside a library's message,
    but the line of the kernel's own code that failed is what its author needs to find."""
    where = raised_in(exc, code) if code else ""
    suffix = f" (raised in {where})" if where else ""
    return one_line(f"{type(exc).__name__}: {exc}", limit - len(suffix)) + suffix


def raised_in(exc: BaseException, module: str) -> str:
    """``function, file.py:line`` of the deepest frame of ``exc``'s traceback in the package ``module`` belongs to
    (``tiledattn`` for ``tiledattn`` or ``tiledattn.contender``; ``attnbench.impls`` for a built-in contender's
    ``attnbench.impls.bmm``): the line of that package's code nearest the failure, where torch or a library raised
    under it; empty when no frame lies in that package. An exception a library raised from another (Triton's
    interpreter wraps a kernel's error in its InterpreterError) is followed to its cause, as Python prints the
    chain: the kernel's own line is the cause's."""
    package = module.rsplit(".", 1)[0] if "." in module else module
    where, seen = "", set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for frame, line in traceback.walk_tb(current.__traceback__):
            name = frame.f_globals.get("__name__", "")
            if name == package or name.startswith(f"{package}."):
                where = f"{frame.f_code.co_name}, {Path(frame.f_code.co_filename).name}:{line}"
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return where


def one_line(message: str, limit: int = REASON_CHARS) -> str:
    """``message`` (any number of lines) as the one-line reason :func:`reason` describes."""
    clauses: list[str] = []
    open_clause = ""  # a line ending with ":" waits for the line that completes it
    frame_indent = -1  # a Python traceback's frame was the last line: the source line under it goes too
    for raw in _TRIGGERED.sub("", message).splitlines():
        stripped, indent = raw.strip(), len(raw) - len(raw.lstrip())
        under_frame, frame_indent = 0 <= frame_indent < indent, -1
        if _FRAME.match(stripped):
            frame_indent = indent
        if under_frame or not stripped or any(noise.match(stripped) for noise in _NOISE_LINES):
            continue
        line = " ".join(_LOCATION.sub("", stripped).split())
        if not line:  # nothing but a location
            continue
        if open_clause:
            line = f"{open_clause} {line}"
        if line.endswith(":"):
            open_clause = line
            continue
        open_clause = ""
        clauses.append(line)
    if open_clause:  # a headline whose explanation was all noise
        clauses.append(open_clause.rstrip(":"))
    clauses = list(dict.fromkeys(clauses))  # in order, each once
    text = "; ".join([*(c.removesuffix(".") for c in clauses[:-1]), *clauses[-1:]])
    return text if len(text) <= limit else _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis, at a word's end when one is near."""
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit * 0.8:
        cut = cut[:space]
    return cut.rstrip(" ;,:") + "…"

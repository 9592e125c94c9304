"""Why an SDPA backend has no kernel for a workload, in torch's own words and only the forced backend's.

When the one enabled backend refuses a call, torch raises "No available kernel" and first warns, backend by
backend, why each was not used: "Memory efficient kernel not used because:", then its reasons, then the same
for flash and for cuDNN (on CPU: flash only). The other backends' reasons there are only "… has been runtime
disabled" (``sdpa_kernel`` turned them off), so a row's reason keeps the forced backend's section, each warning
cut to its first line without torch's "(Triggered internally at …/sdp_utils.cpp:986.)".
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable

import torch

from attnbench.contenders.contract import Unsupported
from attnbench.errors import one_line

_NO_KERNEL = re.compile(r"No available kernel|No viable backend", re.IGNORECASE)
_SECTION = re.compile(r"^(?P<backend>.+?) kernel not used because:?$")
# The headers torch's select_sdp_backend (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp and the CPU's
# sdp_utils_cpp.cpp) warns before each backend's reasons, by SDPBackend member.
SECTIONS = {
    "Memory efficient": "EFFICIENT_ATTENTION",
    "Flash attention": "FLASH_ATTENTION",
    "cuDNN attention": "CUDNN_ATTENTION",
}


def clause(message: str) -> str:
    """torch's own words of a warning or error: its first line, without "(Triggered internally at
    …/sdp_utils.cpp:986.)" — a reason a reader can take in at a glance."""
    lines = message.strip().splitlines()
    return one_line(lines[0]) if lines else ""


def backend_reasons(member: str, messages: Iterable[str]) -> list[str]:
    """The clauses of ``messages`` in ``member``'s section (all of them when torch named no sections),
    each once, in order; the section headers themselves are left out."""
    clauses = [clause(message) for message in messages]
    headed = [_SECTION.match(text) for text in clauses]
    if not any(headed):
        return list(dict.fromkeys(text for text in clauses if text))
    kept: list[str] = []
    current = None
    for text, header in zip(clauses, headed, strict=True):
        if header is not None:
            current = SECTIONS.get(header["backend"], header["backend"])
        elif current == member and text:
            kept.append(text)
    return list(dict.fromkeys(kept))


def probe(run: Callable[[], torch.Tensor], member: str) -> None:
    """Call once so 'no kernel for this backend' surfaces as Unsupported with torch's reasons for ``member``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run()
        except RuntimeError as exc:
            if not _NO_KERNEL.search(str(exc)):
                raise
            why = "; ".join(backend_reasons(member, (str(w.message) for w in caught)))
            raise Unsupported(f"no kernel for this workload: {why or clause(str(exc))}") from None

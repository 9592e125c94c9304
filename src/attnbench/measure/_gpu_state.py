"""What the GPU ran at while a case was timed: SM and memory clocks, power, temperature, throttle reasons.

A GPU's clock moves with its temperature and power draw (at its power limit the driver lowers the SM clock
and sets the ``sw_power_cap`` reason), so a time means little without the clock it ran at. NVML is read
through nvidia-ml-py (``import pynvml``) once per sample, while the GPU runs the sample's calls
(attnbench.measure.stopwatch_cuda), and a case's readings are summarised into its row:

* ``sm_clock_mhz``, ``mem_clock_mhz``, ``power_w``: medians over the case's samples;
* ``sm_clock_min_mhz``: the lowest SM clock seen, ``max_sm_clock_mhz``: the GPU's maximum (boost) SM clock;
* ``gpu_temp_c``: the highest temperature seen;
* ``throttle``: the throttle reasons seen in any sample (NVML's "clocks event reasons"), by name, e.g.
  ``sw_power_cap,hw_thermal_slowdown``; empty when none was.

A case ran throttled when a reason that slows the clock was set (power cap, thermal or hardware slowdown),
or below its maximum clock when its median SM clock is under ``BELOW_MAX`` of the maximum: the run then
warns (:func:`warning`). Without nvidia-ml-py or a driver to answer, nothing is recorded and the columns
stay empty; a run never fails for it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# NVML's clocks event (throttle) reason bits, nvml.h
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
SLOWING = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
BELOW_MAX = 0.95  # a median SM clock under this share of the maximum is "below its maximum clock"
COLUMNS = ("sm_clock_mhz", "sm_clock_min_mhz", "max_sm_clock_mhz", "mem_clock_mhz", "power_w", "gpu_temp_c", "throttle")


@dataclass(frozen=True)
class Reading:
    sm_mhz: float
    mem_mhz: float
    power_w: float | None
    temp_c: float | None
    reasons: int  # NVML's bit mask


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


class Watch:
    """Reads one GPU through NVML; ``read()`` is None when NVML can't answer."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle
        self.max_sm_mhz: float | None = _quiet(
            lambda: float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        )
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def read(self) -> Reading | None:
        nvml, handle = self._nvml, self._handle
        try:
            sm = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
            mem = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM))
            reasons = int(self._reasons(handle))
        except Exception:  # NVML errors (a driver that doesn't support the query): no reading, never a failed case
            return None
        power = _quiet(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1e3)  # mW
        temp = _quiet(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
        return Reading(sm, mem, power, temp, reasons)


def _quiet(read: Any) -> Any:
    try:
        return read()
    except Exception:  # one query a driver lacks leaves one column empty
        return None


def _nvml_index(torch_index: int) -> int:
    """NVML counts every GPU of the machine; CUDA_VISIBLE_DEVICES renumbers what torch sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [part.strip() for part in visible.split(",") if part.strip()]
    if ids and all(part.isdigit() for part in ids) and torch_index < len(ids):
        return int(ids[torch_index])
    return torch_index


def open_watch() -> Watch | None:
    """A Watch on torch's current CUDA device (found by PCI bus id where torch knows it), or None without
    nvidia-ml-py or a driver."""
    try:
        import pynvml as nvml  # nvidia-ml-py
        import torch

        nvml.nvmlInit()
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        bus = getattr(props, "pci_bus_id", None)
        try:
            domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
            handle = nvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08X}:{bus:02X}:{device:02X}.0".encode())
        except Exception:  # no bus id from torch, or NVML can't see it (MIG, containers): by index
            handle = nvml.nvmlDeviceGetHandleByIndex(_nvml_index(index))
        return Watch(nvml, handle)
    except Exception:  # no nvidia-ml-py, no driver, an unknown device: the columns stay empty
        return None


def summary(readings: Iterable[Reading], max_sm_mhz: float | None) -> dict[str, Any]:
    """A case's readings as its row's columns (see the module docstring); {} without readings."""
    seen = list(readings)
    if not seen:
        return {}
    powers = [r.power_w for r in seen if r.power_w is not None]
    temps = [r.temp_c for r in seen if r.temp_c is not None]
    mask = 0
    for reading in seen:
        mask |= reading.reasons
    return {
        "sm_clock_mhz": statistics.median(r.sm_mhz for r in seen),
        "sm_clock_min_mhz": min(r.sm_mhz for r in seen),
        "max_sm_clock_mhz": max_sm_mhz,
        "mem_clock_mhz": statistics.median(r.mem_mhz for r in seen),
        "power_w": statistics.median(powers) if powers else None,
        "gpu_temp_c": max(temps) if temps else None,
        "throttle": ",".join(name for name in reason_names(mask) if name != "gpu_idle"),
    }


def slowed(state: Mapping[Any, Any]) -> str | None:
    """Why a case's clock was not the GPU's best, in a few words, or None: a slowing reason seen, or a median
    SM clock under BELOW_MAX of the maximum."""
    reasons = [name for name in str(state.get("throttle") or "").split(",") if name in SLOWING]
    clock, top = state.get("sm_clock_mhz"), state.get("max_sm_clock_mhz")
    below = clock is not None and top and clock == clock and clock < BELOW_MAX * top
    parts = ([f"throttled ({', '.join(reasons)})"] if reasons else []) + (
        [f"SM clock {clock:.0f} of {top:.0f} MHz"] if below else []
    )
    return "; ".join(parts) or None

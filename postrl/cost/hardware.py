"""The hardware a step is costed on: GPU presets from their datasheets, this machine's CPU
measured now, or figures given on the command line. It knows nothing of models or steps.

    hardware("h100-sxm")                  # a preset; common names too: hardware("h100") is h100-sxm
    hardware("cpu", threads, shapes)      # measured now, at the step's own matmul shapes
    hardware("custom:tflops=T,tbps=B,gib=G")
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from postrl.errors import UserError

GIB = 2**30
GPU_FLOPS_SHARE = 0.4
"""Share of a GPU's dense bf16 peak the model's matmuls are assumed to reach: large dense models'
training runs report 35-50%; small models reach less. No GPU figure here is measured."""
GPU_BANDWIDTH_SHARE = 0.7
"""Share of a GPU's datasheet bandwidth that a decode step's reads (weights, KV cache) are assumed to reach."""


@dataclass(frozen=True)
class GpuPreset:
    tflops: float
    """Dense bf16 tensor-core TFLOP/s (the datasheets' 'with sparsity' figures are twice these)."""
    tbps: float
    """Memory bandwidth, TB/s."""
    gib: float
    """Memory, as the datasheet gives it."""
    device_name: str
    """A part of the name `torch.cuda.get_device_name` gives it; the first preset whose part matches wins."""
    source: str
    """The NVIDIA datasheet or product page the figures come from."""


_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
GPU_PRESETS: dict[str, GpuPreset] = {  # ordered: "H100 PCIe" before "H100", "L40S" before "L4"
    "h200": GpuPreset(989.0, 4.8, 141, "H200", "https://www.nvidia.com/en-us/data-center/h200/"),
    "h100-pcie": GpuPreset(756.0, 2.0, 80, "H100 PCIe", _H100),
    "h100-sxm": GpuPreset(989.0, 3.35, 80, "H100", _H100),
    "a100-80gb": GpuPreset(312.0, 2.039, 80, "A100",  # SXM; the PCIe part: 1.935 TB/s, the 40 GB: 1.555
                           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                           "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "l40s": GpuPreset(362.05, 0.864, 48, "L40S", "https://www.nvidia.com/en-us/data-center/l40s/"),
    "l4": GpuPreset(121.0, 0.3, 24, "L4", "https://www.nvidia.com/en-us/data-center/l4/"),
}
COMMON_NAMES: dict[str, str] = {"h100": "h100-sxm", "a100": "a100-80gb"}
"""The names people type for a GPU -> the preset each means: an H100 is taken to be the SXM part (the
8-GPU servers' H100), an A100 the one A100 preset here, the 80 GB SXM part."""


def preset_name(name: str) -> str | None:
    """The GPU preset `name` means, in any case: a preset's own name or a common name; None for neither.

        >>> preset_name("h100"), preset_name("A100"), preset_name("h100-pcie"), preset_name("tpu")
        ('h100-sxm', 'a100-80gb', 'h100-pcie', None)
    """
    key = name.lower()
    key = COMMON_NAMES.get(key, key)
    return key if key in GPU_PRESETS else None


def known_names() -> str:
    """The names `hardware` takes, for its errors: cpu, the presets with the common names they answer to."""
    common = ", ".join(f"{alias} = {preset}" for alias, preset in COMMON_NAMES.items())
    return f"cpu, {', '.join(GPU_PRESETS)} ({common})"


@dataclass(frozen=True)
class Hardware:
    name: str
    """The preset's own name (a common name resolved: `preset_name`), cpu, or the custom spec."""
    peak_flops: float
    """Dense matmul FLOP/s: a GPU's datasheet bf16 figure, or the CPU's float32 rate measured now."""
    flops_share: float
    """Share of peak_flops the model's matmuls reach: assumed on a GPU, 1 on the CPU (measured)."""
    bandwidth: float
    """Memory bytes/s: the datasheet's, or the CPU's copy bandwidth measured now."""
    bandwidth_share: float
    memory_gib: float
    accelerator: bool
    """A device the host queues work on: host and device time overlap. On the CPU the host is the
    device, and they add up."""
    source: str
    shape_shares: dict[str, float] = field(default_factory=dict)
    """Share of peak_flops that matmuls of a kind reach where measured apart (on the CPU, at the
    step's own shapes, `matmul_shapes`): "decode", a decode step's few rows through the MLP, and
    "head", a few dozen rows through the vocabulary head; a kind not measured: flops_share."""

    @property
    def flops(self) -> float:
        return self.peak_flops * self.flops_share

    def rate(self, kind: str) -> float:
        """FLOP/s of `kind`'s matmuls (`shape_shares`)."""
        return self.peak_flops * self.shape_shares.get(kind, self.flops_share)

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth * self.bandwidth_share


def hardware(name: str, threads: int = 0, shapes: dict[str, tuple[int, int, int]] | None = None,
             dtype: str = "float32") -> Hardware:
    """`name`: a GPU preset or a common name for one (`preset_name`; the result is named after the
    preset), `cpu` (this machine's CPU, measured now in `dtype` with `threads` torch
    threads, 0 = torch's default, and at `shapes`, rows x in x out by kind, `matmul_shapes`) or
    `custom:tflops=T,tbps=B,gib=G` (dense bf16 TFLOP/s, TB/s, GiB)."""
    if name == "cpu":
        return probe_cpu(threads, shapes or {}, dtype)
    if name.startswith("custom:"):
        return _custom(name)
    preset = preset_name(name)
    if preset is None:
        raise UserError(f"unknown hardware {name!r}: one of {known_names()}, or custom:tflops=T,tbps=B,gib=G")
    p = GPU_PRESETS[preset]
    return Hardware(preset, p.tflops * 1e12, GPU_FLOPS_SHARE, p.tbps * 1e12, GPU_BANDWIDTH_SHARE, p.gib, True, p.source)


def _custom(spec: str) -> Hardware:
    fields: dict[str, float] = {}
    for part in spec.removeprefix("custom:").split(","):
        key, _, value = part.partition("=")
        try:
            fields[key.strip()] = float(value)
        except ValueError:
            fields[key.strip()] = math.nan
    if set(fields) != {"tflops", "tbps", "gib"} or not all(v > 0 for v in fields.values()):
        raise UserError(f"malformed hardware {spec!r}: custom:tflops=T,tbps=B,gib=G takes three positive numbers "
                        f"(dense bf16 TFLOP/s, memory TB/s, memory GiB); the others: {known_names()}")
    return Hardware(spec, fields["tflops"] * 1e12, GPU_FLOPS_SHARE, fields["tbps"] * 1e12, GPU_BANDWIDTH_SHARE,
                    fields["gib"], True, "given on the command line")


@contextmanager
def torch_threads(n: int) -> Iterator[int]:
    """torch's intra-op threads set to `n` inside the block (0: left as they are); yields the count."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def check_hardware(name: str) -> None:
    """The one-line error `hardware` gives for `name`, before anything slow runs."""
    if name != "cpu":
        hardware(name)


def probe_cpu(threads: int = 0, shapes: dict[str, tuple[int, int, int]] | None = None, dtype: str = "float32",
              seconds: float = 1.5) -> Hardware:
    """This machine's CPU, measured now in about `seconds`: `dtype` matmul FLOP/s of 1024-wide
    squares and of each of `shapes` (rows x in x out), and copy bandwidth (64 MiB, read and write
    counted), with the run's torch threads. The kinds are timed in turns, so that a slow spell of a
    shared machine falls on all of them, and each figure is the median of its repeats, not the best:
    a sustained rate under whatever loads the machine now."""
    shapes = {"square": (1024, 1024, 1024), **(shapes or {})}
    element = getattr(torch, dtype)
    operands = {kind: (torch.randn(rows, inner, dtype=element), torch.randn(inner, out, dtype=element))
                for kind, (rows, inner, out) in shapes.items()}
    src = torch.ones(16 * 2**20)
    dst = torch.empty_like(src)
    work = {kind: (lambda a=a, b=b: torch.mm(a, b)) for kind, (a, b) in operands.items()}
    with torch_threads(threads) as n:
        times = _median_times({**work, "copy": lambda: dst.copy_(src)}, seconds)
    rates = {kind: 2 * math.prod(shape) / times[kind] for kind, shape in shapes.items()}
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return Hardware("cpu", rates["square"], 1.0, 2 * src.numel() * 4 / times["copy"], 1.0, ram_gib, False,
                    f"measured now, {n} torch thread{'s' if n > 1 else ''}, {os.cpu_count()} cores",
                    {kind: rate / rates["square"] for kind, rate in rates.items() if kind != "square"})


def _median_times(work: dict[str, Callable[[], object]], seconds: float, block: float = 0.05) -> dict[str, float]:
    """Median seconds of each of `work`'s calls, run in turns for `seconds` (3 rounds at least):
    each turn repeats one call for `block` seconds and keeps all but its first time, since a call
    after another kind of work waits for the threads to wake, which back-to-back work does not."""
    times: dict[str, list[float]] = {name: [] for name in work}
    end, rounds = time.perf_counter() + seconds, 0
    while time.perf_counter() < end or rounds < 3:
        rounds += 1
        for name, fn in work.items():
            fn()
            stop = time.perf_counter() + block
            while time.perf_counter() < stop or len(times[name]) < rounds:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}

"""Hardware profiles: the peak figures the analytical cost model starts from.

Every figure is per device and dense (no structured sparsity). Bandwidths are one
direction. Sources are vendor datasheet figures (see docs/planner.md); the `cpu`
profile describes this development machine, where a "device" is one worker process
pinned to one core. Achieved rates are peak times an efficiency factor from
`asyncflow.planner.calibration`.
"""

from __future__ import annotations

import msgspec

GB = 1e9
GiB = 2**30


class Hardware(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    peak_bf16_flops: float  # dense bf16 FLOP/s per device
    memory_bandwidth_bytes_per_s: float  # device memory (HBM) bandwidth
    memory_bytes: float  # device memory size
    intra_node_bandwidth_bytes_per_s: float  # device-to-device inside a node, one direction
    inter_node_bandwidth_bytes_per_s: float  # per device across nodes (its NIC share)
    host_to_device_bandwidth_bytes_per_s: float  # host buffer -> device (the weight swap)
    devices_per_node: int
    collective_latency_s: float  # one small all-reduce inside a node
    usable_memory_fraction: float = 0.9  # the rest: runtime, allocator fragmentation
    source: str = ""


HARDWARE: dict[str, Hardware] = {
    # Huawei Atlas 800T A2 (8 x Ascend 910B): 64 GB HBM2e at about 1.6 TB/s, HCCS
    # 56 GB/s per link, 7 links in a full mesh; one 200GE RoCE port per NPU.
    # Dense FP16/BF16 figure for the 910B2/B3 class as published: about 313 TFLOPS.
    "910b": Hardware(
        name="910b",
        peak_bf16_flops=313e12,
        memory_bandwidth_bytes_per_s=1.6e12,
        memory_bytes=64 * GB,
        intra_node_bandwidth_bytes_per_s=56 * GB,
        inter_node_bandwidth_bytes_per_s=25 * GB,
        host_to_device_bandwidth_bytes_per_s=25 * GB,  # PCIe 4.0 x16
        devices_per_node=8,
        collective_latency_s=30e-6,
        source="Huawei Atlas 800T A2 / Ascend 910B public specifications",
    ),
    # NVIDIA A100 SXM4 80GB datasheet: 312 TFLOPS BF16 dense, 2,039 GB/s HBM2e,
    # NVLink 600 GB/s bidirectional; HGX nodes of 8; one 200 Gb/s HDR NIC per GPU.
    "a100": Hardware(
        name="a100",
        peak_bf16_flops=312e12,
        memory_bandwidth_bytes_per_s=2.039e12,
        memory_bytes=80 * GB,
        intra_node_bandwidth_bytes_per_s=300 * GB,
        inter_node_bandwidth_bytes_per_s=25 * GB,
        host_to_device_bandwidth_bytes_per_s=25 * GB,  # PCIe 4.0 x16
        devices_per_node=8,
        collective_latency_s=15e-6,
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)",
    ),
    # NVIDIA H100 SXM5 datasheet: 989 TFLOPS BF16 dense (1,979 with sparsity),
    # 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s bidirectional; 400 Gb/s NDR per GPU.
    "h100": Hardware(
        name="h100",
        peak_bf16_flops=989e12,
        memory_bandwidth_bytes_per_s=3.35e12,
        memory_bytes=80 * GB,
        intra_node_bandwidth_bytes_per_s=450 * GB,
        inter_node_bandwidth_bytes_per_s=50 * GB,
        host_to_device_bandwidth_bytes_per_s=50 * GB,  # PCIe 5.0 x16
        devices_per_node=8,
        collective_latency_s=10e-6,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5)",
    ),
    # NVIDIA H200 SXM datasheet: same compute as H100, 141 GB HBM3e at 4.8 TB/s.
    "h200": Hardware(
        name="h200",
        peak_bf16_flops=989e12,
        memory_bandwidth_bytes_per_s=4.8e12,
        memory_bytes=141 * GB,
        intra_node_bandwidth_bytes_per_s=450 * GB,
        inter_node_bandwidth_bytes_per_s=50 * GB,
        host_to_device_bandwidth_bytes_per_s=50 * GB,
        devices_per_node=8,
        collective_latency_s=10e-6,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM)",
    ),
    # This machine: 2 AMD EPYC cores (AVX2 + FMA, ~2.45 GHz), 24 GiB. A device is one
    # core: 2 FMA units x 8 fp32 lanes x 2 FLOP x 2.45 GHz ~ 78 GFLOP/s (fp32: the CPU
    # engines compute in fp32; "bf16" is the nominal name of the field). Memory
    # bandwidth: the measured memcpy rate (3.5 GB/s) shared by the cores; process to
    # process: the nng ipc rate (1.6 GB/s). Calibrate with `afctl profile`.
    "cpu": Hardware(
        name="cpu",
        peak_bf16_flops=78e9,
        memory_bandwidth_bytes_per_s=3.5e9,
        memory_bytes=10 * GiB,
        intra_node_bandwidth_bytes_per_s=1.6e9,
        inter_node_bandwidth_bytes_per_s=1.35e9,
        host_to_device_bandwidth_bytes_per_s=3.5e9,
        devices_per_node=2,
        collective_latency_s=150e-6,
        source="this machine: lscpu, docs FIELD-NOTES measurements",
    ),
}

ALIASES = {"ascend910b": "910b", "ascend": "910b", "npu": "910b", "h100-sxm": "h100", "a100-80g": "a100"}


def get_hardware(name: str) -> Hardware:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}: choose one of {', '.join(sorted(HARDWARE))}")
    return HARDWARE[key]

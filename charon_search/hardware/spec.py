"""GpuSpec, TopologyTier, ClusterSpec: hardware as data, loaded from ``cluster_specs/*.yaml``.

All values are SI (bytes, seconds, FLOP/s, bytes/s); the YAML loader converts human units once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from charon_search.errors import ConfigError

#: Serving engines a cluster calibrates per-engine times for (``ENGINE_KEYED_TIMES``); the
#: engines ``serving.backends`` has launch profiles of.
SERVING_ENGINES = ("vllm", "sglang", "trtllm")
#: Serving front ends that stream an engine's tokens in place of its own server
#: (``ServingConfig.frontend``); the ``FRONTEND_KEYED_TIMES`` mappings may key them too.
SERVING_FRONTENDS = ("dynamo",)
#: ``Calibration`` mappings keyed by the process a request goes through: an engine's key is its
#: own server, a ``SERVING_FRONTENDS`` key that front end whatever the engine (the simulator
#: looks them up by ``ServingConfig.frontend or engine``).
FRONTEND_KEYED_TIMES = ("frontend_latency_s", "frontend_prompt_token_s",
                        "frontend_output_token_s", "frontend_output_stream_s")
#: Every ``Calibration`` mapping keyed by serving engine (or, for ``FRONTEND_KEYED_TIMES``, by
#: front end): the loader checks each one's keys and values.
ENGINE_KEYED_TIMES = (*FRONTEND_KEYED_TIMES, "prefill_iteration_overhead_s",
                      "eager_kernel_host_s", "disagg_handoff_s")

__all__ = ["PEAK_FALLBACK", "TIER_FABRICS", "Calibration", "ClusterSpec", "GpuSpec",
           "TopologyTier"]

#: What a tier's links are (``TopologyTier.fabric``): ``nvlink`` an NVLink / NVSwitch domain (a
#: DGX/HGX node, an NVL72 rack), ``pcie`` GPUs that talk over PCIe (switches, CPU root
#: complexes), ``network`` scale-out NICs (InfiniBand, RoCE). The measured intra-node NCCL rows
#: (``cost.measured_collectives``) apply behind an ``nvlink`` or ``pcie`` innermost tier.
TIER_FABRICS = ("nvlink", "pcie", "network")


#: Where a GPU lists no peak for a dtype, the dtype whose tensor cores run it, followed until
#: a listed one (``GpuSpec.compute_dtype``). 4-bit formats on a GPU without FP4 tensor cores are
#: weight-only (W4A16: the kernels dequantize to bf16 and compute there; the serving check
#: admits no other 4-bit GEMM on such GPUs), so fp4 and int4 go to bf16 (fp16 where only that is
#: listed); fp8 without FP8 tensor cores likewise (weight-only fp8, as Marlin runs on A100).
PEAK_FALLBACK = {"fp32": "tf32", "fp16": "bf16", "bf16": "fp16", "fp4": "bf16", "int4": "bf16",
                 "fp8": "bf16", "int8": "fp8"}

#: Fused-attention kernel generations a GPU's attention costs can represent: 1 FlashAttention in
#: Triton, 2 FlashAttention-2, 3 FlashAttention-3 / cuDNN / TRT-LLM (``cost.attention_kernels``).
ATTENTION_KERNEL_GENS = (1, 2, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One accelerator model."""

    name: str
    """Normalized key, e.g. ``h100-sxm-80gb``."""
    aliases: tuple[str, ...] = ()
    """Other spellings resolving to this GPU (``h100_sxm``, ``NVIDIA H100 80GB HBM3``...)."""
    peak_flops_per_s: Mapping[str, float]
    """Dense tensor-core peak per dtype key (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``,
    ``fp4``); dtypes the GPU lacks are absent."""
    hbm_capacity_bytes: float
    hbm_bandwidth_bytes_per_s: float
    nvlink_bandwidth_bytes_per_s: float
    """Unidirectional NVLink bandwidth per GPU (0 for PCIe-only parts)."""
    nic_bandwidth_bytes_per_s: float
    """Scale-out NIC bandwidth per GPU, unidirectional."""
    num_sms: int
    launch_overhead_s: float = 4e-6
    """Fixed per-kernel cost added by the roofline model."""
    compute_efficiency: float = 0.75
    """Achievable fraction of peak FLOP/s for large GEMMs (roofline); calibrated."""
    memory_efficiency: float = 0.85
    """Achievable fraction of HBM bandwidth (roofline); calibrated."""
    compute_efficiency_by_dtype: Mapping[str, float] = field(default_factory=dict)
    """Per-dtype override of ``compute_efficiency`` (e.g. FP8 GEMMs reach less of their peak)."""
    sustained_clock_ratio: float = 1.0
    """Tensor-core throughput a long training run sustains at the board power limit, as a
    fraction of what the profile rows / short microbenchmarks measured (those run at boost
    clock). The training simulator divides compute-bound kernel times (GEMMs, attention) by it;
    memory-bound ops are unaffected (HBM clock is not power-throttled)."""
    attention_kernel_gen: int = 2
    """Generation of the fused-attention kernel the GPU's attention costs represent (3: FA3 /
    cuDNN / TRT-LLM class on Hopper and Blackwell; 2: FlashAttention-2, the best on Ampere and
    Ada); see ``cost.attention_kernels``."""
    nccl_profile_gpu: str = ""
    """Normalized name of the GPU whose measured intra-node NCCL rows stand in for this one's
    (a variant on the same NVLink / NVSwitch or PCIe fabric: ``a100-sxm-40gb`` ->
    ``a100-sxm-80gb``); read only by ``cost.measured_collectives``. Empty: the GPU's own rows
    (or none)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Field name -> where the figure comes from."""
    description: str = ""
    """Free text for people (part, memory type, power)."""

    def __post_init__(self) -> None:
        # ``cost.attention_kernels.GEN_SLOWDOWN`` relates generations 1 -> 2 -> 3.
        if self.attention_kernel_gen not in ATTENTION_KERNEL_GENS:
            raise ConfigError(f"`attention_kernel_gen` of GPU {self.name} must be one of "
                              f"{list(ATTENTION_KERNEL_GENS)}, but got "
                              f"{self.attention_kernel_gen!r}")

    def compute_dtype(self, dtype: str) -> str:
        """The ``peak_flops_per_s`` key whose tensor cores run ``dtype`` on this GPU: ``dtype``
        itself where listed, else the first listed one along ``PEAK_FALLBACK`` (fp8 -> bf16 on
        A100; fp4 and int4 are weight-only there, W4A16, and run at the bf16 rate)."""
        cur, seen = dtype, {dtype}
        while cur not in self.peak_flops_per_s:
            nxt = PEAK_FALLBACK.get(cur)
            if nxt is None or nxt in seen:
                raise ConfigError(
                    f"GPU {self.name} has no peak FLOP/s for dtype {dtype!r}; "
                    f"known: {sorted(self.peak_flops_per_s)}"
                )
            cur = nxt
            seen.add(cur)
        return cur

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype`` (``compute_dtype``: fp32 falls back to tf32 tensor
        cores where the spec lists no fp32, 4-bit formats without FP4 tensor cores to bf16)."""
        hit = self.peak_flops_per_s.get(dtype)
        return hit if hit is not None else self.peak_flops_per_s[self.compute_dtype(dtype)]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopologyTier:
    """One level of the network hierarchy, innermost first."""

    name: str
    """``nvlink``, ``rail``, ``leaf``, ``spine``, ``pod``..."""
    num_devices: int
    """Devices reachable within this tier (cumulative: the NVLink tier of a DGX is 8)."""
    bandwidth_bytes_per_s: float
    """Unidirectional bandwidth per GPU across this tier."""
    latency_s: float
    """Per-hop latency (the α of the α-β model before calibration)."""
    algorithms: tuple[str, ...] = ("ring", "tree")
    """Collective algorithms available on this tier (``ring``, ``tree``, ``nvls``...)."""
    oversubscription: float = 1.0
    """Bandwidth divided by this when the whole tier is busy (1.0 = non-blocking)."""
    source: str = ""
    """Where the tier's figures come from."""
    fabric: str = ""
    """One of ``TIER_FABRICS``. Empty: taken from the name (``nvlink`` and ``pcie`` name their
    fabric, any other name is ``network``); the YAML loader asks for it explicitly where the
    innermost tier has another name, so that an NVLink tier is never taken for a network."""
    job_devices: int = 0
    """Devices of each domain that a job's consecutive ranks fill before they move on to the
    next domain (0: all ``num_devices``). Set on the innermost tier where schedulers leave
    part of a domain out: GB200 NVL72 jobs take 16 of a rack's 18 trays (64 of 72 GPUs), so
    rank 64 opens the second rack (``cost.collectives`` counts ranks per domain that way)."""

    def __post_init__(self) -> None:
        if not self.fabric:
            inferred = self.name if self.name in ("nvlink", "pcie") else "network"
            object.__setattr__(self, "fabric", inferred)
        if self.fabric not in TIER_FABRICS:
            raise ConfigError(f"`fabric` of tier {self.name} must be one of "
                              f"{list(TIER_FABRICS)}, but got {self.fabric!r}")
        if not 0 <= self.job_devices <= self.num_devices:
            raise ConfigError(f"`job_devices` of tier {self.name} must be in [0, num_devices="
                              f"{self.num_devices}], but got {self.job_devices}")
        if self.num_devices <= 0:
            raise ConfigError(f"`num_devices > 0` must hold for tier {self.name}, "
                              f"but got {self.num_devices}")
        if self.bandwidth_bytes_per_s <= 0:
            raise ConfigError(f"`bandwidth > 0` must hold for tier {self.name}, "
                              f"but got {self.bandwidth_bytes_per_s}")
        if self.latency_s < 0:
            raise ConfigError(f"`latency >= 0` must hold for tier {self.name}, "
                              f"but got {self.latency_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Values real systems do not publish; fitted by ``charon-search calibrate`` (or defaults).

    ``provenance`` says where each fitted value came from (a fit on which records, or a default).
    """

    collective_alpha_s: Mapping[str, float] = field(default_factory=dict)
    """Tier name -> fitted per-step latency α of the α-β model. A key ``<tier>.<algorithm>``
    (``nvlink.nvls``) overrides it for one algorithm."""
    collective_bw_efficiency: Mapping[str, float] = field(default_factory=dict)
    """Tier name -> fraction of the tier's link bandwidth NCCL reaches (β = 1/(eff·bw)); a key
    ``<tier>.<algorithm>`` overrides it for one algorithm."""
    overlap_compute_slowdown: float = 1.0
    """Compute kernels run this many times slower while a collective overlaps them (≥ 1)."""
    overlap_comm_slowdown: float = 1.0
    """Collectives run this many times slower while compute overlaps them (≥ 1)."""
    iteration_cpu_overhead_s: float = 0.0
    """Per-iteration host/scheduler overhead (serving) or per-step overhead (training)."""
    frontend_latency_s: Mapping[str, float] = field(default_factory=dict)
    """Serving engine (``vllm``, ``sglang``, ``trtllm``: its own server) or ``dynamo`` (NVIDIA
    Dynamo's front end, whatever the engine) -> seconds a request spends there on this
    cluster's hosts (``ServingConfig.frontend_latency_s``); a front end not listed has none."""
    frontend_prompt_token_s: Mapping[str, float] = field(default_factory=dict)
    """Serving engine (its own server) or ``dynamo`` (NVIDIA Dynamo's front end, whatever the
    engine) -> seconds per prompt token a request spends there on this cluster's hosts before
    the scheduler sees it (text -> token ids and the request's input processing:
    ``ServingConfig.frontend_prompt_token_s``); a front end not listed has none."""
    frontend_output_token_s: Mapping[str, float] = field(default_factory=dict)
    """Serving engine -> seconds that engine's serving front end spends per streamed output
    token on this cluster's hosts, one token after another for all requests
    (``ServingConfig.frontend_output_token_s``); an engine not listed has none. A front end
    of ``SERVING_FRONTENDS`` (``dynamo``) is keyed by its own name: launched through it, every
    engine streams at its rate (``ServingConfig.frontend``)."""
    frontend_output_stream_s: Mapping[str, float] = field(default_factory=dict)
    """Serving engine (its own server) or ``dynamo`` -> seconds that front end spends per
    streaming request per output cycle on this cluster's hosts, tokens that wait for a cycle
    merging into one chunk per request (``ServingConfig.frontend_output_stream_s``); a front
    end not listed has none."""
    prefill_iteration_overhead_s: Mapping[str, float] = field(default_factory=dict)
    """Serving engine -> host seconds an iteration carrying prompt tokens adds to its GPU time
    on this cluster's hosts (``ServingConfig.prefill_iteration_overhead_s``); an engine not
    listed has none."""
    eager_kernel_host_s: Mapping[str, float] = field(default_factory=dict)
    """Serving engine -> host seconds per operator of an iteration that runs without a CUDA
    graph on this cluster's hosts (the Python model code dispatching and launching each kernel:
    prompt iterations, and decode batches no graph was captured for). Such an iteration lasts at
    least operators x this, so the host bounds it once tensor parallelism has made the GPU's
    share short; an engine not listed has only ``ServingConfig.kernel_launch_overhead_s``."""
    disagg_handoff_s: Mapping[str, float] = field(default_factory=dict)
    """Serving engine -> seconds a disaggregated request's hand-over from its prefill replica
    to its decode replica takes on this cluster beyond moving the KV bytes
    (``ServingConfig.disagg_handoff_s``); an engine not listed has none."""
    allocator_reserved_factor: float = 1.0
    """peak_reserved = peak_allocated × this (caching-allocator fragmentation headroom)."""
    allocator_reserved_extra_bytes: float = 0.0
    """Constant reserved headroom (CUDA context, workspace) added per GPU."""
    comm_buffer_bytes: float = 0.0
    """NCCL/communication buffers per process group."""
    collective_launch_s: float = 0.0
    """Fixed cost of one collective (kernel launch, NCCL setup), added once per call."""
    provenance: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """A cluster: GPU type, node size, topology tiers innermost first, calibration, price."""

    name: str
    gpu: GpuSpec
    num_gpus: int
    """GPUs in the whole cluster (the largest job it can run)."""
    gpus_per_node: int
    tiers: tuple[TopologyTier, ...]
    calibration: Calibration = field(default_factory=Calibration)
    cost_per_gpu_hour_usd: float = 0.0
    source: str = ""
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Field name -> where the figure comes from (e.g. ``cost_per_gpu_hour_usd``)."""

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError(f"cluster {self.name}: `tiers` must not be empty")
        sizes = [t.num_devices for t in self.tiers]
        if sizes != sorted(sizes):
            raise ConfigError(
                f"cluster {self.name}: tiers must be innermost first with growing num_devices, "
                f"but got {sizes}"
            )

    def tier_for_span(self, span: int) -> TopologyTier:
        """The innermost tier that contains ``span`` consecutive ranks."""
        for tier in self.tiers:
            if span <= tier.num_devices:
                return tier
        return self.tiers[-1]

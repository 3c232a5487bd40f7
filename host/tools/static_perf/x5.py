"""The static performance model of the X5 BPU that hb_perf estimates with.

The real hb_perf reads the compiler's own simulation; bpuemu has no
instruction-level compiler, so it estimates from first principles. Every
number below is a parameter of this model, not a measurement of a board:

    peak int8 compute     10 TOPS at a 1 GHz BPU clock
                          -> mac_ops_per_cycle = 10e12 / 1e9 = 10,000 OPs/cycle
                             (1 MAC = 2 OPs, so a 5,000-MAC array)
    vector unit           vector_ops_per_cycle = 512 OPs/cycle (assumed)
    data movement         move_bytes_per_cycle = 256 bytes/cycle (assumed)
    DDR bandwidth         ddr_bytes_per_s = 10 GB/s, effective (assumed; --ddr-bandwidth)
    on-chip SRAM          sram_bytes = 1 MiB (assumed): an intermediate tensor
                          larger than this spills to DDR (stored, then loaded)
    channel alignment     channel_align = 8: the MAC array and the vector unit
                          work on channel groups of 8 (NHWC, C padded)
    subgraph launch       subgraph_overhead_cycles = 5,000 (5 us per BPU subgraph,
                          the function-call setup)

Per layer (one compute node of a BPU subgraph), a roofline:

    OPs            Conv: 2 * N * Cout * Hout * Wout * (Cin / group) * kH * kW
                   ConvTranspose: 2 * N * Cin * Hin * Win * (Cout / group) * kH * kW
                   Gemm / MatMul: 2 * M * N * K (times the batch dims)
                   pooling: output elements * kernel elements; global pooling,
                   reductions: input elements; everything else: output elements
    aligned OPs    OPs scaled by the channel padding: (align(Cout)/Cout) *
                   (align(Cin/group)/(Cin/group)) on the MAC array (so a
                   depthwise conv pays 8x), align(C)/C on the other units
    compute        aligned OPs / (OPs per cycle of the layer's unit)   [cycles]
                   ("view" layers -- Reshape, Flatten -- cost nothing; a passive
                   layer fused into the layer before it, such as the Relu after
                   a Conv, costs no cycles of its own)
    DDR bytes      loaded: the subgraph inputs it is the first to read, its
                   weights and biases, spilled intermediates it reads;
                   stored: subgraph outputs and spilled intermediates it makes
    memory         DDR bytes / (ddr_bytes_per_s / clock_hz)               [cycles]
    latency        max(compute, memory)  (compute and DMA overlap)

    These are the figures of compile_mode latency at optimize_level O3. The
    compile strategy a model records changes them (bpuemu.host.tools.static_perf.strategy):
    bandwidth mode stores outputs and spills packed (valid bytes instead of the
    aligned layout's) and adds repack cycles (packed bytes / move_bytes_per_cycle)
    to compute; balance N mixes the two N:100-N; below O3 intermediates spill above
    half the SRAM, below O2 latency = compute + memory, at O0 nothing is fused.

    subgraph latency = subgraph_overhead_cycles + sum of its layer latencies
    model latency    = sum of its BPU subgraph latencies (CPU ops are not
                       estimated; measure them with hrt_model_exec perf)
    FPS              = 1 / model latency (one frame in flight, one core)
    DDR per frame    = sum over subgraphs of loaded + stored bytes
"""
from dataclasses import dataclass, replace


def align(value: int, to: int) -> int:
    return -(-int(value) // to) * to if value > 0 else 0


@dataclass(frozen=True)
class X5Bpu:
    """Parameters of the static X5 BPU model (see the module docstring)."""

    int8_tops: float = 10.0
    clock_hz: float = 1.0e9
    vector_ops_per_cycle: float = 512.0
    move_bytes_per_cycle: float = 256.0
    ddr_bytes_per_s: float = 10.0e9
    sram_bytes: int = 1 << 20
    channel_align: int = 8
    subgraph_overhead_cycles: float = 5000.0

    @property
    def mac_ops_per_cycle(self) -> float:
        return self.int8_tops * 1e12 / self.clock_hz

    @property
    def ddr_bytes_per_cycle(self) -> float:
        return self.ddr_bytes_per_s / self.clock_hz

    def ops_per_cycle(self, unit: str) -> float:
        """Throughput of a BPU unit (bpuemu.host.compiler.optable.UNITS); 0 for "view" (free)."""
        return {"mac": self.mac_ops_per_cycle, "vector": self.vector_ops_per_cycle,
                "move": self.move_bytes_per_cycle, "view": 0.0}[unit]

    def compute_cycles(self, unit: str, aligned_ops: float) -> float:
        rate = self.ops_per_cycle(unit)
        return aligned_ops / rate if rate else 0.0

    def memory_cycles(self, ddr_bytes: float) -> float:
        return ddr_bytes / self.ddr_bytes_per_cycle

    def us(self, cycles: float) -> float:
        return cycles / self.clock_hz * 1e6

    def with_ddr_bandwidth(self, gb_per_s: float) -> "X5Bpu":
        return replace(self, ddr_bytes_per_s=gb_per_s * 1e9)

    def parameters(self) -> dict:
        """The parameters as the report lists them."""
        return {
            "int8 peak (TOPS)": self.int8_tops,
            "BPU clock (GHz)": self.clock_hz / 1e9,
            "MAC array (OPs/cycle)": self.mac_ops_per_cycle,
            "vector unit (OPs/cycle)": self.vector_ops_per_cycle,
            "data movement (bytes/cycle)": self.move_bytes_per_cycle,
            "DDR bandwidth (GB/s)": self.ddr_bytes_per_s / 1e9,
            "on-chip SRAM (bytes)": self.sram_bytes,
            "channel alignment": self.channel_align,
            "subgraph launch (us)": self.us(self.subgraph_overhead_cycles),
        }


X5_BPU = X5Bpu()

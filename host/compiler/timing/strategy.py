"""The compile strategy a `.bin` was built with, as the static estimate uses it.

makertbin records compiler_parameters in the `.bin` the way hb_model_info
shows them: ``hbdk_pass_through_params`` such as ``--fast --O3`` (latency),
``--O2`` (bandwidth) or ``--balance 40 --O3``. hb_perf reads them back here
and costs the model the way that strategy would run it (see ``x5`` for the
formulas):

compile_mode / balance_factor -- the layout of tensors in DDR
    latency      subgraph outputs and spilled intermediates are kept in DDR
                 in the BPU's aligned layout (channels padded to
                 ``channel_align``): more bytes, no extra work;
    bandwidth    they are packed to their valid shape: fewer bytes, but the
                 data-movement unit repacks every byte it moves
                 (``move_bytes_per_cycle``);
    balance N    in between: a fraction N/100 of that traffic is laid out
                 as in latency mode, the rest as in bandwidth mode (0 is
                 bandwidth, 100 is latency, as the seed says).
optimize_level -- what the scheduler does
    O0           no layer fusion, no overlap of compute and DMA
    O1           + fusion of passive layers into the layer before them
    O2           + compute/DMA overlap (a layer costs max(compute, memory))
    O3           + the whole on-chip SRAM for intermediates (O0-O2 tile for
                 half of it, so larger intermediates spill to DDR)
"""
from dataclasses import dataclass
from typing import Optional

from bpuemu.common.proto import model_pb2

COMPILE_MODES = ("latency", "bandwidth", "balance")
OPTIMIZE_LEVELS = ("O0", "O1", "O2", "O3")


@dataclass(frozen=True)
class CompileStrategy:
    compile_mode: str = "latency"
    optimize_level: str = "O3"
    balance_factor: Optional[int] = None
    #: False when the .bin records no compiler parameters and these are the defaults.
    recorded: bool = True

    @property
    def level(self) -> int:
        return OPTIMIZE_LEVELS.index(self.optimize_level)

    @property
    def latency_share(self) -> float:
        """The share of DDR traffic laid out for latency (1: latency mode, 0: bandwidth mode)."""
        if self.compile_mode == "balance":
            return (self.balance_factor or 0) / 100.0
        return 1.0 if self.compile_mode == "latency" else 0.0

    @property
    def fuses(self) -> bool:
        return self.level >= 1

    @property
    def overlaps(self) -> bool:
        return self.level >= 2

    @property
    def sram_share(self) -> float:
        return 1.0 if self.level >= 3 else 0.5

    def describe(self) -> str:
        """``compile_mode latency, optimize_level O3`` (+ balance_factor), as hb_perf prints it."""
        mode = self.compile_mode + (f" (balance_factor {self.balance_factor})" if self.compile_mode == "balance" else "")
        where = "from the model's compiler parameters" if self.recorded else "assumed: the model records none"
        return f"compile_mode {mode}, optimize_level {self.optimize_level} ({where})"


DEFAULT_STRATEGY = CompileStrategy()


def strategy_of(model: model_pb2.Model) -> CompileStrategy:
    """The strategy recorded in ``model.build_info.compiler_parameters`` (defaults when there is none)."""
    params = {kv.key: kv.value for kv in model.build_info.compiler_parameters}
    flags = params.get("hbdk_pass_through_params")
    if flags is not None:
        return _from_flags(flags.split())
    mode, level = params.get("compile_mode"), params.get("optimize_level")
    if mode is None and level is None:
        return CompileStrategy(recorded=False)
    factor = params.get("balance_factor")
    return CompileStrategy(mode if mode in COMPILE_MODES else "latency",
                           level if level in OPTIMIZE_LEVELS else "O3",
                           int(factor) if factor and factor.isdigit() else None)


def _from_flags(flags) -> CompileStrategy:
    mode, factor, level = "bandwidth", None, "O3"
    for i, flag in enumerate(flags):
        if flag == "--fast":
            mode = "latency"
        elif flag == "--balance" and i + 1 < len(flags) and flags[i + 1].isdigit():
            mode, factor = "balance", min(100, int(flags[i + 1]))
        elif flag.startswith("--O") and flag[2:] in OPTIMIZE_LEVELS:
            level = flag[2:]
    return CompileStrategy(mode, level, factor)

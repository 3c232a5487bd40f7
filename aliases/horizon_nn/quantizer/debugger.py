"""``import horizon_nn.quantizer.debugger as dbg``: the seed's name for bpuemu.host.debugger."""
from bpuemu.host.debugger import *  # noqa: F401,F403
from bpuemu.host.debugger import __all__  # noqa: F401

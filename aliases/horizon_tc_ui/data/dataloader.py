"""The seed's import path of the data loaders, as a thin alias of bpuemu.host.data.dataloader.

    from horizon_tc_ui.data.dataloader import ImageNetDataLoader, SingleImageDataLoader
"""
from bpuemu.host.data.dataloader import *  # noqa: F401,F403
from bpuemu.host.data.dataloader import __all__  # noqa: F401

"""The seed's import path of the data-preparation transformers, as a thin alias of bpuemu.host.data.transformer.

    from horizon_tc_ui.data.transformer import ShortSideResizeTransformer, CenterCropTransformer
"""
from bpuemu.host.data.transformer import *  # noqa: F401,F403
from bpuemu.host.data.transformer import __all__  # noqa: F401

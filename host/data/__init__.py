"""Data preparation as the seed's ``horizon_tc_ui.data`` spells it: transformers and loaders on the one
transforms module (``bpuemu.host.convert.transforms``)."""

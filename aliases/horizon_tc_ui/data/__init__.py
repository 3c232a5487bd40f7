"""The seed's data-preparation modules (``horizon_tc_ui.data.transformer``, ``.dataloader``): aliases of
``bpuemu.host.data``."""

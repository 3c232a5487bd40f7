"""horizon_nn.quantizer: holds only the ``debugger`` alias."""

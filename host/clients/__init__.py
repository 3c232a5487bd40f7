"""Board clients of the host: the SSH transport (the gRPC client is the board's own, bpuemu.board.client)."""

"""python -m bpuemu.board.daemon: run hrt_boardd (bpuemu.board.cli.hrt_boardd)."""
from bpuemu.board.cli.hrt_boardd import main

main()

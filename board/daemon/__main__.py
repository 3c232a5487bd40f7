from bpuemu.board.daemon.cli import main

main()

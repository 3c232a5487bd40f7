from bpuemu.board.hrt_model_exec.cli import main

main()

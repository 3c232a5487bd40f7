"""hrt_model_exec: the board-side model tool (model_info, infer, perf)."""


def main(args=None):
    from bpuemu.board.hrt_model_exec.cli import main as _main

    _main(args)

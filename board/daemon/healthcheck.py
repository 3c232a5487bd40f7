"""The health probe deploy/ runs (the image's HEALTHCHECK, compose, install.sh):

    python -m bpuemu.board.daemon.healthcheck [--target 127.0.0.1:9473] [--service NAME] [--timeout 3] [-q]

It is bpuemu.board.cli.healthcheck under the name deployed boards already call; the probe itself
is bpuemu.board.health.check.
"""
from bpuemu.board.cli.healthcheck import main

if __name__ == "__main__":
    main()

from bpuemu.host.verifier.cli import main

main()

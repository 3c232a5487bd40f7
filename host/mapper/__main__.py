from bpuemu.host.mapper.cli import main

main()

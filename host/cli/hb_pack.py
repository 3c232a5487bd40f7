"""hb_pack BIN_FILE1 BIN_FILE2 ... -o comb.bin"""
import click

from bpuemu.common.errors import BpuEmuError
from bpuemu.host.cli import log, run, setup_logging, version_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bin_files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output_name", required=True, help="Output name of the packed model.")
@version_option("hb_pack")
def cli(bin_files, output_name):
    """Pack several hybrid models (*.bin) into one model file."""
    from bpuemu.host.tools.pack import pack_files

    setup_logging()
    try:
        names = pack_files(bin_files, output_name)
    except BpuEmuError:
        click.echo("ERROR exception in command: pack", err=True)
        raise
    log.info("packed %d models (%s) into %s", len(names), ", ".join(names), output_name)


def main(args=None):
    run(cli, "hb_pack", args)


if __name__ == "__main__":
    main()

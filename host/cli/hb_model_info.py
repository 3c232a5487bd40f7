"""hb_model_info BIN_FILE [-m NAME] [--json]"""
import json
import os

import click

from bpuemu.host.cli import model_name_option, run, version_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bin_file", type=click.Path(dir_okay=False))
@model_name_option
@click.option("--json", "as_json", is_flag=True, help="Print the information as JSON instead.")
@version_option("hb_model_info")
def cli(bin_file, model_name, as_json):
    """Print the dependencies and compile parameters stored in a hybrid model (*.bin)."""
    from bpuemu.common.container import read_bin
    from bpuemu.host.tools import model_info

    binfile = read_bin(bin_file)
    models = model_info.select(binfile, model_name or None)
    if as_json:
        click.echo(json.dumps(model_info.summary(binfile), indent=2))
        return
    click.echo(model_info.model_info_text(binfile, model_name or None))
    written = model_info.write_deleted_nodes_info(models)
    if written:
        click.echo(f"deleted nodes info written to {os.path.abspath(written)}")


def main(args=None):
    run(cli, "hb_model_info", args, hints={"model_name": "pick the model with -m NAME"})


if __name__ == "__main__":
    main()

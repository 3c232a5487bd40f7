"""hb_model_modifier BIN_FILE [-r NAME]... [-a TYPE]... [-o OUT]"""
import click

from bpuemu.common.errors import InvalidInput
from bpuemu.host.cli import log, run, setup_logging, version_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("bin_file", required=False, type=click.Path(dir_okay=False))
@click.option("--model_file", default="", help="Runtime model file name (instead of BIN_FILE).")
@click.option("-r", "remove", multiple=True, metavar="NAME", help="Name of a node to remove; repeat for more.")
@click.option("-a", "--all", "types", multiple=True, metavar="TYPE",
              help="Remove every removable node of this type (Quantize, Transpose, Dequantize, Cast, Reshape, "
                   "Softmax); repeat for more.")
@click.option("-o", "output", default="", help="Output name of the modified model (default: <model>_modified.bin).")
@version_option("hb_model_modifier")
def cli(bin_file, model_file, remove, types, output):
    """Remove nodes at the inputs and outputs of a hybrid model (*.bin); with no option, list the removable ones."""
    from bpuemu.common.container import read_bin, write_bin
    from bpuemu.host.compiler import modifier

    setup_logging()
    path = bin_file or model_file
    if not path:
        raise click.UsageError("give the model: hb_model_modifier MODEL.bin")
    binfile = read_bin(path)
    if binfile.manifest.packed or len(binfile.manifest.models) != 1:
        raise modifier.PackedModelNotSupported()
    model = binfile.manifest.models[0]
    if not remove and not types:
        log.info("Nodes that can be deleted: %s", [c.name for c in modifier.removable_nodes(model, binfile.blobs)])
        return
    modifier.check_types(types)
    new, blobs, removed = modifier.modify(model, binfile.blobs, names=remove, types=types)
    if not removed:
        raise InvalidInput(f"no removable node of type {', '.join(types)} in {path}",
                           hint="list the removable nodes with: hb_model_modifier " + path)
    for r in removed:
        click.echo(f"Node '{r.name}' found, its OP type is '{r.op_type}'")
        click.echo(f"Node '{r.name}' is removed")
    out = output or modifier.modified_name(path)
    write_bin(out, [new], blobs)
    click.echo(f"modified model saved as {out}")


def main(args=None):
    run(cli, "hb_model_modifier", args)


if __name__ == "__main__":
    main()

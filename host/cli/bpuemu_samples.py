"""bpuemu-samples copy ocr DIR | bpuemu-samples models ocr DIR"""
import click

from bpuemu.host.cli import log, run, setup_logging, version_option

SAMPLES = ("ocr",)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("bpuemu-samples")
def cli():
    """The conversion samples shipped with bpuemu.

    \b
    ocr  PaddleOCR PP-OCRv4 text detector, direction classifier and recogniser on labelled synthetic pages:
         01_check.sh, 02_preprocess.sh, 03_build.sh, 04_inference.sh, 05_evaluate.sh, preprocess.py,
         inference.py, postprocess.py, the yaml configs
    """


@cli.command()
@click.argument("sample", type=click.Choice(SAMPLES))
@click.argument("directory", type=click.Path(file_okay=False))
def copy(sample, directory):
    """Copy a sample's workflow into DIRECTORY (new or empty); run its scripts in order there."""
    from bpuemu.host.samples.ocr import workflow

    setup_logging()
    written = workflow.copy(directory)
    log.info("copied the %s sample (%d files) to %s; next: %s/01_check.sh", sample, len(written), directory,
             directory.rstrip("/"))


@cli.command()
@click.argument("sample", type=click.Choice(SAMPLES))
@click.argument("directory", type=click.Path(file_okay=False))
def models(sample, directory):
    """Put a sample's float models into DIRECTORY (downloaded with pip once, then from the cache)."""
    from bpuemu.host.samples.ocr import workflow

    setup_logging()
    for name, path in workflow.copy_models(directory).items():
        log.info("%s model: %s", name, path)


def main(args=None):
    run(cli, "bpuemu-samples", args)


if __name__ == "__main__":
    main()

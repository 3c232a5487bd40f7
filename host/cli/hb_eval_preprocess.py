"""hb_eval_preprocess -m MODEL_NAME -i IMAGE_DIR -o OUTPUT_DIR [-v VAL_TXT] [--model_table FILE.yaml]"""
import click

from bpuemu.host.cli import log, run, setup_logging, version_option
from bpuemu.host.tools.eval_preprocess import MODELS


def _model_list() -> str:
    width = max(len(n) for n in MODELS)
    return "\n".join(f"{name.ljust(width)}  {str(entry.get('size')).ljust(7)}  {entry.get('description', '')}".rstrip()
                     for name, entry in sorted(MODELS.items()))


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
               epilog="\b\nSupported model names (size HxW):\n" + _model_list())
@version_option("hb_eval_preprocess")
@click.option("-m", "--model_name", required=True, metavar="MODEL_NAME",
              help="Model name: one of the names listed below, or one from --model_table.")
@click.option("-i", "--image_dir", required=True, type=click.Path(file_okay=False), help="Input image directory.")
@click.option("-o", "--output_dir", required=True, type=click.Path(file_okay=False),
              help="Output directory: one <image>.bin per image, in the model's input_type_rt layout.")
@click.option("-v", "--val_txt", default=None, type=click.Path(dir_okay=False),
              help="File naming the images to preprocess (first word of each line), in that order.")
@click.option("--model_table", default=None, type=click.Path(dir_okay=False), metavar="FILE.yaml",
              help="Extra model entries (same keys as the built-in ones); they add to or replace them.")
def cli(model_name, image_dir, output_dir, val_txt, model_table):
    """Preprocess images for model accuracy evaluation on the board (hrt_model_exec infer --input_file)."""
    from bpuemu.host.tools import eval_preprocess

    setup_logging()
    report = eval_preprocess.run(model_name, image_dir, output_dir, val_txt,
                                 eval_preprocess.load_table(model_table))
    log.info("wrote %d file(s) to %s%s", len(report.written), output_dir,
             f"; {len(report.errors)} image(s) failed" if report.errors else "")
    if report.errors:
        raise SystemExit(1)


def main(args=None):
    run(cli, "hb_eval_preprocess", args)


if __name__ == "__main__":
    main()

"""bpuemu-ocr-eval: the OCR sample's 05_evaluate step (float vs quantized vs board, on task metrics).

    bpuemu-ocr-eval --data data/evaluation --model-dir model_output \\
        --board 127.0.0.1:9473,127.0.0.1:9474 --results eval_results.jsonl
"""
import json
import os
import tempfile

import click

from bpuemu.board.cli.edge import run
from bpuemu.board.cli.options import CONNECTION_HINTS, board_option, split_list, tls_options, token_option


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.option("--data", "data", default="data/evaluation", show_default=True, type=click.Path(file_okay=False),
              metavar="DIR", help="The evaluation split (pages.json, lines.json and their images).")
@click.option("--model-dir", default="model_output", show_default=True, type=click.Path(file_okay=False),
              help="makertbin's working_dir holding ppocr_det, ppocr_cls and ppocr_rec (original float, quantized, .bin).")
@click.option("--det", default="", metavar="PATH", help="The detector: working_dir/prefix [default: MODEL_DIR/ppocr_det].")
@click.option("--cls", "cls_dir", default="", metavar="PATH", help="The direction classifier [default: MODEL_DIR/ppocr_cls].")
@click.option("--rec", default="", metavar="PATH", help="The recogniser [default: MODEL_DIR/ppocr_rec].")
@board_option(help="Run the .bin on these boards (HOST:PORT[,HOST:PORT...] or @FILE); the images are spread over "
                   "them. Default: hrt_boardd started on loopback for the run (--local-boards).")
@click.option("--local-boards", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Without --board: how many hrt_boardd to start on loopback for the run.")
@token_option
@tls_options
@click.option("--sides", default="float,quantized,board", show_default=True,
              help="Which to evaluate: float (original float ONNX), quantized (quantized ONNX), board (.bin).")
@click.option("--results", default="ocr_eval_results.jsonl", show_default=True, type=click.Path(dir_okay=False),
              help="Per-image results (JSON lines); a re-run resumes from it.")
@click.option("--report", "report_path", default="", type=click.Path(dir_okay=False),
              help="Also write the metrics, the board/quantized agreement and per-board throughput as JSON here.")
@click.option("--pages", default=None, type=click.IntRange(0), help="Only the first N pages.")
@click.option("--lines", default=None, type=click.IntRange(0), help="Only the first N lines.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def cli(data, model_dir, det, cls_dir, rec, board, local_boards, token, tls, sides, results, report_path, pages,
        lines, no_progress):
    """Evaluate the OCR pipeline (det, cls, rec) on its task metrics: float ONNX, quantized ONNX and the board."""
    import contextlib

    from bpuemu.board.farm import BoardAccess, parse_boards
    from bpuemu.common.atomic import write_file_atomic
    from bpuemu.host.samples.ocr.evaluate import OcrModels, evaluate, local_boards as start_local

    chosen = split_list(sides)
    models = OcrModels.from_paths(*(path or os.path.join(model_dir, f"ppocr_{k}")
                                    for k, path in (("det", det), ("cls", cls_dir), ("rec", rec))))
    with contextlib.ExitStack() as stack:
        boards = parse_boards(board) if board else []
        if "board" in chosen and not boards:
            click.echo(f"no --board: starting {local_boards} hrt_boardd on loopback for this run")
            boards = stack.enter_context(start_local(
                local_boards, stack.enter_context(tempfile.TemporaryDirectory(prefix="bpuemu-ocr-eval-")), click.echo))
        rep = evaluate(models, data, results, chosen, boards, pages, lines,
                       access=BoardAccess(token=token, tls=tls, client_name="bpuemu-ocr-eval"),
                       progress=not no_progress, echo=click.echo)
    click.echo(rep.table())
    wall = rep.seconds.get("board", 0.0)
    for b in rep.boards:
        click.echo(f"board {b.name}: {b.items} image(s), {b.items / wall if wall else 0.0:.1f} images/s over the run's "
                   f"{wall:.1f} s ({1e3 * b.busy_s / max(1, b.items):.0f} ms per image)"
                   + (f"; left the run: {b.error}" if b.error else ""))
    drop = rep.quantized_drop()
    over = {k: v for k, v in drop.items() if v > 1.0}
    if drop:
        click.echo("quantized vs float: " + ("within 1 point on every metric" if not over else
                   "more than 1 point lower on " + ", ".join(f"{k} ({v:.2f})" for k, v in over.items())))
    if rep.read_differently is not None:
        r = rep.read_differently
        click.echo(f"quantized reads {len(r['differ'])} of {r['compared']} line(s) differently from float")
    if rep.agreement is not None:
        a = rep.agreement
        click.echo(f"board == quantized on {a['identical']} of {a['compared']} image(s)")
        for key in a["differ"]:
            click.echo(f"  differs: {key}")
    click.echo(f"results: {results}")
    if report_path:
        write_file_atomic(report_path, json.dumps(rep.to_json(), indent=2, ensure_ascii=False).encode())
        click.echo(f"report: {report_path}")
    if rep.agreement is not None and rep.agreement["differ"]:
        raise SystemExit(1)


def main(args=None):
    run(cli, "bpuemu-ocr-eval", args, hints=CONNECTION_HINTS)


if __name__ == "__main__":
    main()

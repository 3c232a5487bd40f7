"""hmct-debugger: the accuracy debug tool's command line (thin: parse, call bpuemu.host.debugger).

    hmct-debugger get-sensitivity-of-nodes calibrated_model.onnx calibration_data -m ['cosine-similarity','mse'] -v True
    hmct-debugger plot-acc-error calibrated_model.onnx calibration_data -q ['Conv_2','Conv_90']
    hmct-debugger plot-acc-error calibrated_model.onnx calibration_data -nq [['Conv_2'],['Conv_2','Conv_90']] -a True
    hmct-debugger plot-distribution calibrated_model.onnx calibration_data -n ['317_HzCalibration','Conv_2']
    hmct-debugger get-channelwise-data-distribution calibrated_model.onnx calibration_data -n ['471_HzCalibration']
    hmct-debugger sensitivity-analysis calibrated_model.onnx calibration_data
    hmct-debugger runall calibrated_model.onnx calibration_data

Lists take the seed's syntax. The shell removes the quotes of an unquoted
``['Conv_2','Conv_90']``, so ``[Conv_2,Conv_90]`` is read the same way; a
bare ``Conv_2`` or ``Conv_2,Conv_90`` works too. Subcommands also answer to
their underscore spelling (``plot_acc_error``).
"""
from typing import List, Union

import click

from bpuemu.board.cli.edge import run
from bpuemu.board.cli.options import BoolFlag

Nested = Union[str, List["Nested"]]


def parse_list(text: str) -> List[Nested]:
    """``['a','b']`` / ``[a,b]`` / ``[['a'],['a','b']]`` / ``a,b`` / ``a`` -> a (nested) list of names."""
    s = text.strip()
    pos = 0

    def fail(why: str):
        raise click.BadParameter(f"{text!r} is not a list ({why}); write it as ['Conv_2','Conv_90']")

    def name() -> str:
        nonlocal pos
        start = pos
        while pos < len(s) and s[pos] not in ",[]":
            pos += 1
        token = s[start:pos].strip().strip("'\"").strip()
        if not token:
            fail("empty name")
        return token

    def items(closing: bool) -> List[Nested]:
        nonlocal pos
        out: List[Nested] = []
        while True:
            while pos < len(s) and s[pos] == " ":
                pos += 1
            if closing and pos < len(s) and s[pos] == "]" and not out:
                pos += 1
                return out
            if pos < len(s) and s[pos] == "[":
                pos += 1
                out.append(items(True))
            else:
                out.append(name())
            while pos < len(s) and s[pos] == " ":
                pos += 1
            if pos >= len(s):
                if closing:
                    fail("missing ]")
                return out
            if s[pos] == ",":
                pos += 1
                continue
            if s[pos] == "]":
                if not closing:
                    fail("unbalanced ]")
                pos += 1
                return out
            fail(f"unexpected {s[pos]!r}")

    if not s:
        return []
    if s.startswith("["):
        pos = 1
        out = items(True)
        if s[pos:].strip():
            fail("text after the closing ]")
        return out
    return items(False)


class ListParam(click.ParamType):
    name = "list"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        return parse_list(str(value))


class FlatListParam(ListParam):
    """A list of names, or one name (a metric, a node)."""

    def convert(self, value, param, ctx):
        out = super().convert(value, param, ctx)
        if any(isinstance(v, list) for v in out):
            self.fail(f"{value!r} must be a flat list", param, ctx)
        return out


LIST, FLAT, BOOL = ListParam(), FlatListParam(), BoolFlag()


class DashGroup(click.Group):
    """Subcommands by their seed names, with ``_`` accepted for ``-``."""

    def get_command(self, ctx, cmd_name):
        return super().get_command(ctx, cmd_name.replace("_", "-"))


def _model_and_data(f):
    f = click.argument("calibration_data", type=click.Path())(f)
    return click.argument("model_or_file", type=click.Path())(f)


def _one(values):
    """A list option whose API parameter takes one name (output_node)."""
    if not values:
        return None
    if len(values) != 1:
        raise click.BadParameter(f"give one node, not {values}")
    return values[0]


@click.group(cls=DashGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli():
    """Accuracy debug tool for calibrated models (makertbin's debug_mode: dump_calibration_data)."""


@cli.command("get-sensitivity-of-nodes")
@_model_and_data
@click.option("-m", "--metrics", type=FLAT, default="cosine-similarity", show_default=True,
              help="cosine-similarity, mse, mre, sqnr, chebyshev; a list ranks by the first")
@click.option("-o", "--output_node", type=FLAT, default=None, help="compare this node's output instead of the model's")
@click.option("-n", "--node_type", type=click.Choice(["node", "weight", "activation"]), default="node", show_default=True)
@click.option("-d", "--data_num", type=int, default=None, help="samples to use (default: all)")
@click.option("-v", "--verbose", type=BOOL, default=False, show_default=True, help="print the table")
@click.option("-i", "--interested_nodes", type=FLAT, default=None, help="only these nodes (overrides node_type)")
def sensitivity_cmd(model_or_file, calibration_data, metrics, output_node, node_type, data_num, verbose, interested_nodes):
    """Rank nodes by the output error when only that node is quantized."""
    from bpuemu.host.debugger import get_sensitivity_of_nodes

    result = get_sensitivity_of_nodes(model_or_file, metrics, calibration_data, _one(output_node), node_type, data_num,
                                      verbose, interested_nodes or None)
    if not verbose:
        for name, values in result.items():
            click.echo(f"{name}: " + ", ".join(f"{k} {v}" for k, v in values.items()))


@cli.command("plot-acc-error")
@_model_and_data
@click.option("-s", "--save_dir", default=".", show_default=True)
@click.option("-q", "--quantize_node", type=LIST, default=None, help="['Conv_2','Conv_90'], [['Conv_2'],['Conv_2','Conv_90']], ['weight','activation']")
@click.option("-nq", "--non_quantize_node", type=LIST, default=None, help="nodes kept float, the rest quantized")
@click.option("-m", "--metric", default="cosine-similarity", show_default=True)
@click.option("-a", "--average_mode", type=BOOL, default=False, show_default=True)
def acc_error_cmd(model_or_file, calibration_data, save_dir, quantize_node, non_quantize_node, metric, average_mode):
    """Cumulative error curves of partially quantized models."""
    import os

    from bpuemu.host.debugger import plot_acc_error
    from bpuemu.host.debugger.acc_error import FILE

    curves = plot_acc_error(save_dir, calibration_data, model_or_file, quantize_node, non_quantize_node, metric, average_mode)
    for label, curve in curves.items():
        last = list(curve.items())[-1] if curve else ("-", float("nan"))
        click.echo(f"{label}: {metric} at the last node {last[0]}: {last[1]:.5f}")
    click.echo(f"wrote {os.path.join(save_dir, FILE)}")


@cli.command("plot-distribution")
@_model_and_data
@click.option("-s", "--save_dir", default=".", show_default=True)
@click.option("-n", "--nodes_list", type=FLAT, required=True, help="weight/activation calibration nodes and ordinary nodes")
def distribution_cmd(model_or_file, calibration_data, save_dir, nodes_list):
    """Float vs quantized value distributions of nodes."""
    from bpuemu.host.debugger import plot_distribution

    for path in plot_distribution(save_dir, model_or_file, calibration_data, nodes_list).values():
        click.echo(f"wrote {path}")


@cli.command("get-channelwise-data-distribution")
@_model_and_data
@click.option("-s", "--save_dir", default=".", show_default=True)
@click.option("-n", "--nodes_list", type=FLAT, required=True, help="calibration nodes")
@click.option("-a", "--axis", type=int, default=None, help="channel axis (default: 1 for activations, the node's axis for weights)")
def channelwise_cmd(model_or_file, calibration_data, save_dir, nodes_list, axis):
    """Per-channel box plots of calibration nodes' inputs."""
    from bpuemu.host.debugger import get_channelwise_data_distribution

    for path in get_channelwise_data_distribution(save_dir, model_or_file, calibration_data, nodes_list, axis).values():
        click.echo(f"wrote {path}")


@cli.command("sensitivity-analysis")
@_model_and_data
@click.option("-p", "--pick_threshold", type=float, default=0.999, show_default=True)
@click.option("-d", "--data_num", type=int, default=1, show_default=True)
@click.option("-sn", "--sensitive_nodes", type=FLAT, default=None)
@click.option("-sd", "--save_dir", default=".", show_default=True)
def analysis_cmd(model_or_file, calibration_data, pick_threshold, data_num, sensitive_nodes, save_dir):
    """Quantize the sensitive nodes alone, or keep them float, and plot the output cosine."""
    from bpuemu.host.debugger import sensitivity_analysis

    res = sensitivity_analysis(model_or_file, calibration_data, pick_threshold, data_num, sensitive_nodes or None, save_dir)
    cum = res["cumulative"]
    click.echo(f"calibrated model: output cosine {cum['none']:.5f}")
    for n, c in res["single"].items():
        click.echo(f"{n}: only it quantized {c:.5f}; it and those before it float {cum[n]:.5f}")


@cli.command("runall")
@_model_and_data
@click.option("-s", "--save_dir", default=None, help="default ./debug_result")
@click.option("-nm", "--ns_metrics", type=FLAT, default="cosine-similarity", show_default=True)
@click.option("-o", "--output_node", type=FLAT, default=None)
@click.option("-nt", "--node_type", type=click.Choice(["node", "weight", "activation"]), default="node", show_default=True)
@click.option("-dn", "--data_num", type=int, default=None)
@click.option("-v", "--verbose", type=BOOL, default=False, show_default=True)
@click.option("-i", "--interested_nodes", type=FLAT, default=None)
@click.option("-dnl", "--dis_nodes_list", type=FLAT, default=None)
@click.option("-cn", "--cw_nodes_list", type=FLAT, default=None)
@click.option("-a", "--axis", type=int, default=None)
@click.option("-qn", "--quantize_node", type=LIST, default=None)
@click.option("-nqn", "--non_quantize_node", type=LIST, default=None)
@click.option("-am", "--ae_metric", default="cosine-similarity", show_default=True)
@click.option("-avm", "--average_mode", type=BOOL, default=False, show_default=True)
@click.option("-pt", "--pick_threshold", type=float, default=0.999, show_default=True)
@click.option("-sn", "--sensitive_nodes", type=FLAT, default=None)
def runall_cmd(model_or_file, calibration_data, save_dir, ns_metrics, output_node, node_type, data_num, verbose,
               interested_nodes, dis_nodes_list, cw_nodes_list, axis, quantize_node, non_quantize_node, ae_metric,
               average_mode, pick_threshold, sensitive_nodes):
    """Every analysis in one run: tables, figures, a summary and index.html."""
    import os

    from bpuemu.host.debugger import runall

    res = runall(model_or_file, calibration_data, save_dir, ns_metrics, _one(output_node), node_type, data_num, verbose,
                 interested_nodes or None, dis_nodes_list or None, cw_nodes_list or None, axis, quantize_node or None,
                 non_quantize_node or None, ae_metric, average_mode, pick_threshold, sensitive_nodes or None)
    for f in res.joins:
        if f.collapsed:
            click.echo("WARNING " + f.warning(), err=True)
    click.echo("what to try:")
    for i, a in enumerate(res.advice, 1):
        click.echo(f"  {i}. {a}")
    click.echo(f"wrote {len(res.figures)} figure(s), {len(res.tables)} table(s): "
               f"{os.path.join(res.save_dir, 'index.html')} ({res.seconds:.1f} s)")


def main(args=None) -> None:
    run(cli, "hmct-debugger", args)


if __name__ == "__main__":
    main()

"""The seed's import path of the accuracy debugger works from the installed wheel (not the checkout)."""


def test_horizon_nn_debugger_imports_from_the_wheel(host_venv, tmp_path):
    code = ("import horizon_nn.quantizer.debugger as dbg, inspect; "
            "assert 'site-packages' in dbg.__file__, dbg.__file__; "
            "print(sorted(n for n in dbg.__all__ if not n[0].isupper())); "
            "print(inspect.signature(dbg.get_sensitivity_of_nodes))")
    out = host_venv.run("python", "-c", code, cwd=tmp_path).stdout
    assert "'get_channelwise_data_distribution', 'get_sensitivity_of_nodes'" in out
    assert "'plot_acc_error', 'plot_distribution', 'runall', 'sensitivity_analysis'" in out
    assert ("(model_or_file, metrics='cosine-similarity', calibrated_data=None, output_node: Optional[str] = None, "
            "node_type: str = 'node', data_num: Optional[int] = None, verbose: bool = False") in out
    assert "Usage: hmct-debugger" in host_venv.run("hmct-debugger", "--help", cwd=tmp_path).stdout

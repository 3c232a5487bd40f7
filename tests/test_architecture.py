"""The host/board split holds: checked statically (import-linter) and at run time.

import-linter (grimp) cannot see through the editable install's package-dir
mapping, so the static check runs on a copy of the tree laid out as the
installed package ``bpuemu/{common,board,host}``.
"""
import ast
import json
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent


def package_copy(tmp_path, edit=None):
    """A copy of the tree laid out as the installed package, in ``tmp_path``;
    ``edit(package_dir)`` may change the copy."""
    pkg = tmp_path / "bpuemu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for part in ("common", "board", "host"):
        shutil.copytree(ROOT / part, pkg / part, ignore=shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        edit(pkg)


def run_on_copy(tmp_path, code):
    """``python -c code`` in ``tmp_path``, with the copied package first on its path."""
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)


def lint_imports(tmp_path, edit=None):
    """import-linter's report on a copy of the tree laid out as the installed package;
    ``edit(package_dir)`` may change the copy first."""
    package_copy(tmp_path, edit)
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return run_on_copy(tmp_path, "from importlinter.cli import lint_imports_command; lint_imports_command()")


#: Every import cycle among bpuemu's modules, one JSON list of modules a line: for each import a -> b, the
#: shortest chain of imports from b back to a. grimp's graph holds the imports inside functions too.
_CYCLES = """
import grimp, json
g = grimp.build_graph("bpuemu")
seen = set()
for a in sorted(g.modules):
    for b in sorted(g.find_modules_directly_imported_by(a)):
        back = g.find_shortest_chain(importer=b, imported=a)
        if back and frozenset(back) not in seen:
            seen.add(frozenset(back))
            print(json.dumps([a, *back]))
"""


def import_cycles(tmp_path, edit=None):
    """The import cycles of a copy of the tree (``edit`` as for ``package_copy``), each a list of modules
    from one module back to itself."""
    package_copy(tmp_path, edit)
    proc = run_on_copy(tmp_path, _CYCLES)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_import_contracts(tmp_path):
    """board never imports host, common neither, and the host reads top-down: no host package
    imports one above it in the layers of .importlinter (documented in host/__init__.py)."""
    proc = lint_imports(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout


def test_host_layers_catch_an_upward_import(tmp_path):
    """The layers contract sees an import of a package above, even one inside a function:
    the compiler reaching up into the quantizer breaks it."""
    def upward(pkg):
        path = pkg / "host" / "compiler" / "partition.py"
        path.write_text(path.read_text() + "\n\ndef _upward():\n    from bpuemu.host.quant import graph  # noqa\n")

    proc = lint_imports(tmp_path, upward)
    assert proc.returncode != 0
    assert "The host reads top-down: no host package imports one above it BROKEN" in proc.stdout
    assert "bpuemu.host.compiler.partition -> bpuemu.host.quant.graph" in proc.stdout


def test_no_import_cycles(tmp_path):
    """Modules import each other one way: no cycle, not even through an import inside a function
    (a function-level import that only dodges a cycle hides the cycle; the lower module gets the idea)."""
    assert import_cycles(tmp_path) == []


def test_import_cycles_seen_inside_functions(tmp_path):
    """The cycle check sees an import inside a function: the config's model reaching up into its loader."""
    def upward(pkg):
        path = pkg / "host" / "config" / "model.py"
        path.write_text(path.read_text() + "\n\ndef _complete():\n    from bpuemu.host.config.loader import complete_config  # noqa\n")

    cycles = import_cycles(tmp_path, upward)
    assert any({"bpuemu.host.config.model", "bpuemu.host.config.loader"} <= set(c) for c in cycles), cycles


def test_host_layers_name_every_host_package(tmp_path):
    """A new package of host/ must be given its layer (exhaustive): it cannot slip past the order."""
    def new_package(pkg):
        (pkg / "host" / "newstage").mkdir()
        (pkg / "host" / "newstage" / "__init__.py").write_text("")

    proc = lint_imports(tmp_path, new_package)
    assert proc.returncode != 0
    assert "bpuemu.host.newstage" in proc.stdout + proc.stderr


from helpers.board_only import BLOCKER  # noqa: E402



def test_board_runs_without_host_packages(tmp_path):
    """With onnx, paramiko, yaml, numba and bpuemu.host unimportable, the board still works end to end."""
    from bpuemu.host.samples import sample_bin

    model = tmp_path / "m.bin"
    sample_bin(str(model), height=16, width=16)
    script = BLOCKER + textwrap.dedent(
        f"""
        import bpuemu.board.daemon.server, bpuemu.board.cli.hrt_boardd, bpuemu.board.client, bpuemu.board.backends
        from bpuemu.board.cli.hrt_model_exec import cli
        from click.testing import CliRunner
        r = CliRunner().invoke(cli, ["infer", "--model_file", {str(model)!r}])
        assert r.exit_code == 0, r.output
        assert "infer success" in r.output
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "paramiko", "yaml", "numba") or m.startswith("bpuemu.host"))
        print("HOST-MODULES:", loaded)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "HOST-MODULES: []" in proc.stdout


def test_blocker_really_blocks():
    """The test above would notice an import: the blocker raises for host modules."""
    proc = subprocess.run([sys.executable, "-c", BLOCKER + "import bpuemu.host.samples"], capture_output=True, text=True)
    assert proc.returncode != 0 and "host-only" in proc.stderr


#: The numerical core (DESIGN.md, "Numerical contract"): each function is defined once, in common/.
NUMERICAL_CORE = {
    "dequantize": "bpuemu.common.numerics",
    "Dequantizer": "bpuemu.common.numerics",
    "cosine_similarity": "bpuemu.common.compare",
    "random_rt_inputs": "bpuemu.common.input_types",
    "select_model": "bpuemu.common.container",
}
#: Re-implementations of that core, as they were once copied around the tree.
COPIED_CORE = (
    (re.compile(r"astype\(np\.int32\)\s*-"), "per-axis dequantize arithmetic"),
    (re.compile(r"random_rt_input\("), "random inputs with seed 0 (random_rt_inputs)"),
    (re.compile(r"einsum\(\"i,i->\""), "cosine"),
    (re.compile(r"choose one"), "choosing a model by name"),
    (re.compile(r"is not a readable ONNX model"), "loading an ONNX file (bpuemu.host.onnxgraph.load_onnx)"),
)


def test_common_holds_the_numerical_core():
    """Each piece of the numerical core is defined in common/ and nowhere in board/ or host/;
    common/ imports neither board nor host (the import-linter contract holds that too)."""
    import importlib

    for name, module in NUMERICAL_CORE.items():
        assert getattr(importlib.import_module(module), name).__module__ == module
    for path in sorted((ROOT / "board").rglob("*.py")) + sorted((ROOT / "host").rglob("*.py")):
        if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & (set(NUMERICAL_CORE) | {"cosine"}), f"{path} redefines {defined & set(NUMERICAL_CORE)}"
        text = path.read_text()
        if path == ROOT / "host" / "onnxgraph" / "model.py":
            continue
        for pattern, what in COPIED_CORE:
            assert not pattern.search(text), f"{path.relative_to(ROOT)} re-implements {what}; use bpuemu.common"
    for path in (ROOT / "common").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith(("bpuemu.board", "bpuemu.host")) for n in names), f"{path} imports {names}"


#: The CLI packages: the shared edge (board/cli) and the host's commands (host/cli).
CLI_PACKAGES = ("board/cli/", "host/cli/")


def modules_importing(name: str):
    """Source files under common/, board/ and host/ that import ``name`` (or a submodule of it)."""
    found = []
    for part in ("common", "board", "host"):
        for path in (ROOT / part).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                if any(n == name or n.startswith(name + ".") for n in names):
                    found.append(path.relative_to(ROOT).as_posix())
                    break
    return found


def test_only_the_cli_packages_import_click():
    users = modules_importing("click")
    assert any(u.startswith("board/cli/") for u in users)  # the check sees imports at all
    outside = [u for u in users if not u.startswith(CLI_PACKAGES)]
    assert not outside, f"click imported outside the CLI packages {CLI_PACKAGES}: {outside}"


def test_docs_layout_names_every_package():
    """docs/architecture.md's Layout table has one row per package folder of common/, board/ and host/,
    and every folder it names exists."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)/` \|", section, flags=re.M)
    assert len(rows) == len(set(rows)), "a folder has two rows"
    packages = {str(d.relative_to(ROOT)) for part in ("common", "board", "host")
                for d in [ROOT / part, *(ROOT / part).rglob("*")]
                if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))}
    assert packages - set(rows) == set(), "packages missing from docs/architecture.md's Layout table"
    assert [r for r in rows if not (ROOT / r).is_dir()] == [], "rows naming folders that do not exist"


def test_one_session_opener_on_the_host():
    """The host opens onnxruntime sessions in one place (bpuemu.host.onnxgraph.open_session), with
    the board runtime's session options unless the caller says otherwise: a session made anywhere
    else could silently compute a quantized model differently from the board."""
    opener = ROOT / "host" / "onnxgraph" / "session.py"
    makers = []
    for path in sorted((ROOT / "host").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "InferenceSession":
                makers.append(path)
    assert opener in makers  # the check sees sessions being made at all
    others = sorted({p.relative_to(ROOT).as_posix() for p in makers if p != opener})
    assert not others, f"onnxruntime sessions made outside bpuemu.host.onnxgraph.open_session: {others}"

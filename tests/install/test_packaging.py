"""The package metadata matches what users are told to type and what the tree holds.

* Every command a code block of README.md or of a docs/ page tells a user to
  type is a ``[project.scripts]`` console script (the list comes from the pages,
  not from a hand-kept copy), and every console script has its page in the
  command reference (docs/reference/, generated from its click definition).
* The built wheel holds every ``.py`` file under common/, board/, host/ and
  aliases/ (the seeds' top-level import paths): a
  folder the wheel drops (a missing ``__init__.py`` once dropped
  ``bpuemu.host.compiler``) fails here, not on a user's machine.
"""
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    from pip._vendor import tomli as tomllib

from helpers.docs import ROOT, documented_commands, readme_commands

SOURCE_ROOTS = {"common": "bpuemu/common", "board": "bpuemu/board", "host": "bpuemu/host",
                **{f"aliases/{p.name}": p.name for p in (ROOT / "aliases").iterdir() if p.is_dir()}}

def console_scripts() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def test_readme_commands_parser():
    text = (
        "```bash\n"
        "hb_mapper checker --model m.onnx \\\n"
        "    --march bayes-e   # not a command: continued\n"
        "# a comment\n"
        "scripts/demo.sh\n"
        "$ hrt_model_exec perf --model_file m.bin\n"
        "python3 -m venv /tmp/u\n"
        "```\n"
        "```python\nnot_a_command()\n```\n"
    )
    assert readme_commands(text) == {"hb_mapper", "hrt_model_exec"}


def test_every_documented_command_is_a_console_script():
    commands = documented_commands()
    # The docs document the main job: the conversion, board and verifier tools at least.
    assert {"hb_mapper", "hrt_boardd", "hrt_model_exec", "hb_verifier"} <= readme_commands((ROOT / "README.md").read_text())
    missing = sorted(commands - set(console_scripts()))
    assert not missing, f"the docs tell users to type {missing}, but pyproject.toml [project.scripts] lacks them"


def test_every_console_script_has_its_reference_page():
    """Each console script's page renders its click definition (mkdocs-click) and is in the site's nav."""
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = []
    for script, target in console_scripts().items():
        page = ROOT / "docs" / "reference" / f"{script}.md"
        module = target.split(":")[0]
        if not page.exists() or f":module: {module}" not in page.read_text() or f"reference/{script}.md" not in nav:
            missing.append(script)
    assert not missing, f"console scripts without a reference page in docs/reference/ and mkdocs.yml: {missing}"


def source_files() -> set:
    """The wheel paths every .py file under common/, board/ and host/ must have."""
    files = set()
    for folder, prefix in SOURCE_ROOTS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder)
            if "__pycache__" not in rel.parts and not any(p.startswith(".") for p in rel.parts):
                files.add(f"{prefix}/{rel.as_posix()}")
    return files


def test_wheel_holds_every_source_folder(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = source_files()
    assert "bpuemu/host/compiler/partition.py" in expected  # the folder that was once dropped
    assert "horizon_tc_ui/__init__.py" in expected
    missing = sorted(expected - names)
    missing_dirs = sorted({m.rsplit("/", 1)[0] for m in missing})
    assert not missing, f"the wheel lacks {len(missing)} source file(s), in folders {missing_dirs}"


def test_wheel_ships_the_ocr_sample_workflow_and_photos(wheel):
    """The package data a source-file check cannot see: the sample's scripts, yaml configs and photos."""
    names = set(zipfile.ZipFile(wheel).namelist())
    sample = ROOT / "host" / "samples" / "ocr"
    data = [p for p in (sample / "mapper").iterdir() if p.suffix in (".sh", ".yaml")] + \
        [p for p in (sample / "photos").iterdir() if p.suffix in (".jpg", ".txt")]
    assert len(data) >= 4 + 3 + 4
    missing = sorted(str(p.relative_to(ROOT)) for p in data if f"bpuemu/{p.relative_to(ROOT).as_posix()}" not in names)
    assert not missing, f"the wheel lacks {missing}"


def test_wheel_declares_the_console_scripts(wheel):
    with zipfile.ZipFile(wheel) as z:
        (ep,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = z.read(ep).decode()
    section = text.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    declared = {line.split("=")[0].strip() for line in section.splitlines() if "=" in line}
    assert set(console_scripts()) <= declared


def test_a_wheel_rebuilt_in_the_same_checkout_drops_a_removed_module(tmp_path):
    """A user builds, pulls a change that renames a module, and builds again in the same folder:
    the old module must not ride along from build/lib into the new wheel."""
    import subprocess
    import sys

    from conftest import PIP_TIMEOUT_S, copy_build_inputs

    (tmp_path / "src").mkdir()
    src = copy_build_inputs(tmp_path / "src")
    gone = src / "host" / "samples" / "old_name.py"
    gone.write_text('"""A module that a later change renames."""\n')

    def build(out):
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(out), "--quiet"],
                              cwd=src, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        assert proc.returncode == 0, proc.stderr
        (whl,) = out.glob("bpuemu-*.whl")
        return set(zipfile.ZipFile(whl).namelist())

    assert "bpuemu/host/samples/old_name.py" in build(tmp_path / "dist1")
    gone.rename(gone.with_name("new_name.py"))
    names = build(tmp_path / "dist2")
    assert "bpuemu/host/samples/new_name.py" in names
    assert "bpuemu/host/samples/old_name.py" not in names

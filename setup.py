"""Maps the repository layout onto the ``bpuemu`` import package.

The source lives in ``common/``, ``board/`` and ``host/`` at the repository root
(the layout users and reviewers navigate), while code imports it as
``bpuemu.common``, ``bpuemu.board`` and ``bpuemu.host``. ``aliases/`` holds
thin top-level packages under the seeds' import paths (``horizon_nn``: the
accuracy debugger; ``horizon_tc_ui``: HB_ONNXRuntime). Metadata is in
pyproject.toml; this file only computes the package list from the tree so a
new subpackage needs no edit here. Every folder holding a ``.py`` file is a
package, with or without ``__init__.py``, so a forgotten ``__init__.py`` can no
longer drop a folder from the wheel (tests/install/test_packaging.py checks
the built wheel against the tree).
"""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOTS = {"bpuemu.common": "common", "bpuemu.board": "board", "bpuemu.host": "host",
         # The seed's import path of the accuracy debugger (an alias of bpuemu.host.debugger).
         "horizon_nn": "aliases/horizon_nn",
         # The seed's import path of HB_ONNXRuntime (an alias of bpuemu.host.hb_onnxruntime).
         "horizon_tc_ui": "aliases/horizon_tc_ui"}


def _packages():
    for name, root in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            if any(f.endswith(".py") for f in filenames):
                rel = os.path.relpath(dirpath, root)
                yield name if rel == "." else name + "." + rel.replace(os.sep, ".")


class FreshBuildPy(build_py):
    """Copies the packages into an emptied build/lib: setuptools only ever adds to it, so a module
    deleted or renamed in the tree would otherwise ride along into every later wheel built here."""

    def run(self):
        for top in sorted({name.split(".")[0] for name in ROOTS}):
            shutil.rmtree(os.path.join(self.build_lib, top), ignore_errors=True)
        super().run()


setup(packages=sorted(_packages()), package_dir=dict(ROOTS), cmdclass={"build_py": FreshBuildPy})

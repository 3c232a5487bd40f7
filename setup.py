"""Maps the repository layout onto the ``bpuemu`` import package.

The source lives in ``common/``, ``board/`` and ``host/`` at the repository root
(the layout users and reviewers navigate), while code imports it as
``bpuemu.common``, ``bpuemu.board`` and ``bpuemu.host``. Metadata is in
pyproject.toml; this file only computes the package list from the tree so a
new subpackage needs no edit here.
"""
import os

from setuptools import setup

ROOTS = {"bpuemu.common": "common", "bpuemu.board": "board", "bpuemu.host": "host"}


def _packages():
    for name, root in ROOTS.items():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, root)
                yield name if rel == "." else name + "." + rel.replace(os.sep, ".")


setup(packages=sorted(_packages()), package_dir=dict(ROOTS))

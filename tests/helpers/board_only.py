"""Code that makes the host-only packages unimportable, as on a board install: prepend it to a script."""
import textwrap

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = ("bpuemu.host", "onnx", "paramiko", "yaml", "numba")
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"{name} is host-only and must not be imported on the board")
    sys.meta_path.insert(0, Block())
    """
)

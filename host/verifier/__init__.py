"""hb_verifier: does the board compute what the quantized model computes?

The library (no CLI here): ``verify(VerifyOptions(...))`` runs quanti.onnx on
the host, the `.bin` in the x86 simulator and on boards (gRPC or SSH), compares
every pair and returns a ``VerifyReport``. ``bpuemu.host.cli.hb_verifier`` is the
``hb_verifier`` command. Names load lazily, so ``hb_verifier --help`` stays
instant.
"""
__all__ = ["VerifyOptions", "verify", "VerifyReport", "PairResult", "SideInfo"]

_WHERE = {"VerifyOptions": "core", "verify": "core", "VerifyReport": "report", "PairResult": "report", "SideInfo": "report"}


def __getattr__(name):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""hbm_infer: run an `.hbm` on a board over the network from a host Python process (ptq_faq_j6's first step
when "quantized.bc accuracy is fine but hbm accuracy drops": reproduce the board's output on x86).

    from bpuemu.host.hbm_infer import HbmInfer
    with HbmInfer("model_output/tiny.hbm", "192.168.1.10:9473", timeout_s=30) as board:   # uploads once
        board.input_names, board.output_names, board.input_shapes
        for x in frames:
            outputs = board.run(None, {"data": x})       # what HBRuntime gives on the same .hbm, bit for bit

The board is an hrt_boardd started with the model's march (``hrt_boardd --march nash-e``); a board of another
march refuses the model at load, in one line naming both. The model is uploaded only when the board does not
store it yet (by SHA-256) and loaded once; every call has a deadline (``timeout_s``, the upload's grows with its
size). Errors are BpuEmuError lines (bpuemu.common.errors): an unreachable board, a refused token, a wrong
input. Inputs are what the board takes (input_type_rt: an nv12 frame at the model's row stride, featuremaps
as their tensor properties give them), as for HBRuntime on an `.hbm`.
"""
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from bpuemu.board.client import BoardClient, Deadlines
from bpuemu.host.hb_runtime import checked_request

DEFAULT_TIMEOUT_S = 30.0


def _deadlines(timeout_s: float) -> Deadlines:
    return Deadlines(connect=min(10.0, timeout_s), call=timeout_s, infer=timeout_s, upload_base=timeout_s)


class HbmInfer:
    """An `.hbm` uploaded to and loaded on one board, run frame by frame (a context manager)."""

    def __init__(self, model_file: str, board: str, token: Optional[str] = None, tls=None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, model_name: Optional[str] = None):
        self.model_file = os.fspath(model_file)
        self.board = board.rpartition("://")[2]     # grpc://HOST:PORT as hb_verifier writes it, or HOST:PORT
        self.client = BoardClient(self.board, token=token, tls=tls, deadlines=_deadlines(timeout_s),
                                  client_name="hbm_infer")
        try:
            self.sha = self.client.ensure_model(self.model_file)
            names = self.client.load(self.sha)
            self.model = self.client.model_info(self.sha, model_name or (names[0] if len(names) == 1 else ""))
        except BaseException:
            self.client.close()
            raise
        self.input_names: List[str] = [p.name for p in self.model.inputs]
        self.output_names: List[str] = [p.name for p in self.model.outputs]
        self.input_shapes: Dict[str, List[int]] = {p.name: list(p.valid_shape) for p in self.model.inputs}

    def run(self, output_names: Optional[Sequence[str]], input_feed: Dict[str, np.ndarray]) -> List[np.ndarray]:
        """One frame on the board: the outputs named (all, in output_names order, for None or [])."""
        names = checked_request(self.input_names, self.output_names, output_names, input_feed)
        inputs = [np.asarray(input_feed[n]) for n in self.input_names]
        outputs = self.client.infer(self.sha, self.model.name, inputs, self.input_names).outputs
        return [outputs[n] for n in names]

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "HbmInfer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["DEFAULT_TIMEOUT_S", "HbmInfer"]

"""The OCR sample's evaluation: float ONNX vs quantized ONNX vs the `.bin` on boards, on task metrics.

    models = OcrModels.from_paths("model_output/ppocr_det", "model_output/ppocr_cls", "model_output/ppocr_rec")
    report = evaluate(models, "data/evaluation", sides=("float", "quantized", "board"),
                      boards=["127.0.0.1:9473", "127.0.0.1:9474"], results="eval.jsonl")
    print(report.table())

Each model's conversion outputs (a makertbin working_dir) give three sides:
``float`` (``*_original_float_model.onnx``) and ``quantized``
(``*_quantized_model.onnx``), both run with HB_ONNXRuntime on this host, and
``board`` (the ``.bin``) on one or more boards. All three are fed the same
input_type_rt data, as the seeds' 04_inference step does.

The evaluation set (``dataset.make``'s split folder) gives two kinds of work
items: a *line* (the direction classifier on the line as stored, the
recogniser on the line turned upright by its known angle) and a *page* (the
detector, then the whole pipeline: det -> crop -> cls -> rec). Each item's
predictions go into a results file (JSON lines) as soon as it is done, with a
digest of every raw model output it took; a re-run reads the file and does
only what is missing. Board and quantized ONNX must agree exactly: the report
names every item whose predictions or raw outputs differ.

The board side spreads the items over the boards with the farm's
``map_with_failover``: one worker per board, each with its own connection and
one item in flight. A board that is lost (unreachable, killed, past its
deadline) puts its item back for the others and leaves; the run fails only
when no board is left.
"""
import contextlib
import glob
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.common.input_types import model_hw, to_model_input
from bpuemu.host.samples.ocr import dataset, metrics, models as ocr_models, preprocess
from bpuemu.host.samples.ocr.postprocess import TextBox, cls_direction, ctc_greedy, det_boxes, turn_over

MODELS = ("det", "cls", "rec")
SIDES = ("float", "quantized", "board")


# --- the models ---------------------------------------------------------------------------

def _one(directory: str, pattern: str, what: str) -> str:
    found = sorted(glob.glob(os.path.join(directory, pattern)))
    if len(found) != 1:
        raise NotFound(f"{directory} holds {len(found)} {what} ({pattern}), expected one",
                       hint="give the makertbin working_dir of one model")
    return found[0]


@dataclass(frozen=True)
class ConvertedModel:
    """One model's conversion outputs: the float and quantized ONNX, and the `.bin`."""

    float_onnx: str
    quantized_onnx: str
    bin: str

    @classmethod
    def from_path(cls, path: str) -> "ConvertedModel":
        """``working_dir/prefix`` (the yaml's working_dir and output_model_file_prefix), or a working_dir
        that holds one model."""
        if os.path.isdir(path):
            return cls(_one(path, "*_original_float_model.onnx", "original float models"),
                       _one(path, "*_quantized_model.onnx", "quantized models"),
                       _one(path, "*.bin", "BIN models"))
        files = cls(f"{path}_original_float_model.onnx", f"{path}_quantized_model.onnx", f"{path}.bin")
        missing = [f for f in (files.float_onnx, files.quantized_onnx, files.bin) if not os.path.isfile(f)]
        if missing:
            raise NotFound(f"no converted model {os.path.basename(path)} in {os.path.dirname(path) or '.'}: "
                           f"{', '.join(map(os.path.basename, missing))} missing",
                           hint="convert it first (03_build.sh, hb_mapper makertbin)")
        return files


@dataclass
class OcrModels:
    det: ConvertedModel
    cls: ConvertedModel
    rec: ConvertedModel
    charset: List[str]
    #: from each .bin's manifest: model name and input spec
    names: Dict[str, str] = field(default_factory=dict)
    specs: Dict[str, object] = field(default_factory=dict)
    #: each model's input from an image (the sample's preprocess; det at the .bin's size)
    inputs: Dict[str, preprocess.ModelInput] = field(default_factory=dict)

    @classmethod
    def from_paths(cls, det: str, cls_dir: str, rec: str) -> "OcrModels":
        """Each model's ``working_dir/prefix`` (or a working_dir holding only that model)."""
        from bpuemu.common.container import read_bin

        conv = {k: ConvertedModel.from_path(d) for k, d in zip(MODELS, (det, cls_dir, rec))}
        found = cls(conv["det"], conv["cls"], conv["rec"], ocr_models.charset(conv["rec"].float_onnx))
        for k, c in conv.items():
            m = read_bin(c.bin).model()
            found.names[k], found.specs[k] = m.name, m.input_specs[0]
        _, h, w, _ = model_hw(found.specs["det"])
        found.inputs = preprocess.model_inputs((h, w))
        return found

    def converted(self, which: str) -> ConvertedModel:
        return getattr(self, which)

    def fingerprint(self) -> str:
        """What the results were computed with: every model file's SHA-256."""
        from bpuemu.common.container import file_sha256

        h = hashlib.sha256()
        for k in MODELS:
            c = self.converted(k)
            for path in (c.float_onnx, c.quantized_onnx, c.bin):
                h.update(file_sha256(path).encode())
        return h.hexdigest()


# --- where the models run -----------------------------------------------------------------

class OnnxSide:
    """The float or quantized ONNX of each model, run with HB_ONNXRuntime on this host.

    Both take the ``.bin``'s input_type_rt data converted as the seeds'
    04_inference does (``to_model_input``): the original float model carries
    the same HzPreprocess as the quantized one.
    """

    def __init__(self, models: OcrModels, stage: str):
        from bpuemu.host import HB_ONNXRuntime

        self.name, self.specs, self.inputs = stage, models.specs, models.inputs
        path = {"float": lambda c: c.float_onnx, "quantized": lambda c: c.quantized_onnx}[stage]
        self.sessions = {k: HB_ONNXRuntime(path(models.converted(k))) for k in MODELS}

    def run(self, which: str, rt: np.ndarray) -> List[np.ndarray]:
        sess = self.sessions[which]
        return sess.run(None, {sess.input_names[0]: to_model_input(rt, self.specs[which])})


class BoardSide:
    """The three `.bin` models on one board (a RemoteBackend that holds them)."""

    def __init__(self, name: str, backend, models: OcrModels):
        self.name, self.specs, self.inputs = name, models.specs, models.inputs
        self.handles = {k: backend.model(models.names[k]) for k in MODELS}

    def run(self, which: str, rt: np.ndarray) -> List[np.ndarray]:
        h = self.handles[which]
        outputs = h.infer([rt]).outputs
        return [outputs[n] for n in h.output_names]


def load_rgb(path: str) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"cannot read image {path}: {exc}") from None


# --- the pipeline on one side ----------------------------------------------------------------

class Reader:
    """The OCR pipeline on one side; every raw output it sees goes into ``digest``."""

    def __init__(self, side, charset: Sequence[str]):
        self.side, self.charset = side, charset
        self.digest = hashlib.sha256()

    def _run(self, which: str, rt: np.ndarray) -> List[np.ndarray]:
        outs = self.side.run(which, rt)
        for o in outs:
            self.digest.update(np.ascontiguousarray(o).tobytes())
        return outs

    def _input(self, which: str, image: np.ndarray) -> np.ndarray:
        return self.side.inputs[which].rt_input(image)

    def detect(self, page: np.ndarray) -> List[TextBox]:
        prob = self._run("det", self._input("det", page))[0]
        return det_boxes(prob, page.shape[:2], self.side.inputs["det"].ratio(*page.shape[:2]))

    def direction(self, line: np.ndarray) -> Tuple[int, float]:
        return cls_direction(self._run("cls", self._input("cls", line))[0])

    def recognise(self, line: np.ndarray) -> str:
        return ctc_greedy(self._run("rec", self._input("rec", line))[0], self.charset)[0]

    def read_page(self, page: np.ndarray) -> List[dict]:
        """det -> crop -> cls (turned over when sure) -> rec: each box with its angle and text."""
        found = []
        for box in self.detect(page):
            crop = page[box.y0:box.y1, box.x0:box.x1]
            angle, score = self.direction(crop)
            if turn_over(angle, score):
                crop = crop[::-1, ::-1]
            found.append({"box": list(box.xyxy), "angle": angle, "text": self.recognise(crop)})
        return found


# --- the evaluation set ------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One unit of work: a page (det + end to end) or a line (cls + rec)."""

    kind: str  # "page" | "line"
    file: str  # absolute path
    key: str   # "pages/0000.png": the results file's key
    boxes: Tuple[Tuple[float, ...], ...] = ()
    texts: Tuple[str, ...] = ()
    text: str = ""
    angle: int = 0


def load_items(split_dir: str, pages: Optional[int] = None, lines: Optional[int] = None) -> List[Item]:
    """The split's pages then lines (the first ``pages`` / ``lines`` of each; None: all)."""
    if not os.path.isdir(split_dir):
        raise NotFound(f"no such evaluation set: {split_dir}", hint="make it with 02_preprocess.sh or dataset.make")
    key = lambda f: os.path.relpath(f, split_dir)  # noqa: E731
    items = [Item("page", p.file, key(p.file), tuple(tuple(b) for b in p.boxes), tuple(p.texts))
             for p in dataset.load_pages(split_dir)[:pages]]
    items += [Item("line", ln.file, key(ln.file), text=ln.text, angle=int(ln.angle))
              for ln in dataset.load_lines(split_dir)[:lines]]
    return items


def run_item(side, charset: Sequence[str], item: Item) -> dict:
    """One item on one side: its predictions and the digest of the raw outputs behind them."""
    reader = Reader(side, charset)
    image = load_rgb(item.file)
    if item.kind == "page":
        found = reader.read_page(image)
        pred = {"boxes": [f["box"] for f in found], "angles": [f["angle"] for f in found],
                "texts": [f["text"] for f in found]}
    else:
        angle, score = reader.direction(image)
        upright = image[::-1, ::-1] if item.angle == 180 else image
        pred = {"angle": angle, "angle_score": round(score, 6), "text": reader.recognise(upright)}
    return {"key": item.key, "pred": pred, "digest": reader.digest.hexdigest()}


# --- the results file -----------------------------------------------------------------------------

def _is_result(rec) -> bool:
    """A results-file line as ResultsFile.add writes it: an object with a known side, a key and predictions."""
    return isinstance(rec, dict) and rec.get("side") in SIDES and isinstance(rec.get("key"), str) and "pred" in rec


class ResultsFile:
    """Per-item results as JSON lines, appended as they come; a re-run resumes from them.

    The first line names the models and data the results belong to; a file
    made with others is refused rather than mixed in. A line cut short by a
    crash is dropped (and redone); a line that is whole JSON but not a result
    (another tool's file, an edit) is refused with its line number, not dropped:
    what follows it may be good results.
    """

    def __init__(self, path: str, fingerprint: str):
        self.path = path
        self.done: Dict[str, Dict[str, dict]] = {s: {} for s in SIDES}
        header = {"bpuemu_ocr_eval": 1, "fingerprint": fingerprint}
        good, ends_open = 0, False
        if os.path.exists(path):
            with open(path, "rb") as f:
                raw = f.read()
            lines = raw.split(b"\n")
            try:
                first = json.loads(lines[0])
            except ValueError:
                first = None
            if not isinstance(first, dict) or "bpuemu_ocr_eval" not in first:
                raise InvalidInput(f"{path} is not an OCR evaluation results file", hint="give another --results")
            if first.get("fingerprint") != fingerprint:
                raise InvalidInput(f"{path} holds results of other models or data",
                                   hint="give another --results, or remove it to start over")
            good = len(lines[0]) + 1
            for number, line in enumerate(lines[1:], 2):
                try:
                    rec = json.loads(line)
                except ValueError:
                    break  # the tail a crash cut short (a cut object is never valid JSON)
                if not _is_result(rec):
                    raise InvalidInput(f"{path} line {number} is not an OCR evaluation result: "
                                       f"{line[:60].decode(errors='replace')!r}",
                                       hint="give another --results, or remove it to start over")
                self.done[rec["side"]][rec["key"]] = rec
                good += len(line) + 1
            ends_open = good > len(raw)  # the last result is whole but its newline was not written
            good = min(good, len(raw))
        self._lock = threading.Lock()
        self._f = open(path, "r+b" if os.path.exists(path) else "wb")
        self._f.truncate(good)
        self._f.seek(good)
        if good == 0:
            self._write(header)
        elif ends_open:
            self._f.write(b"\n")

    def _write(self, rec: dict) -> None:
        self._f.write(json.dumps(rec, ensure_ascii=False).encode() + b"\n")
        self._f.flush()

    def add(self, side: str, rec: dict) -> None:
        rec = {"side": side, **rec}
        with self._lock:
            self.done[side][rec["key"]] = rec
            self._write(rec)

    def close(self) -> None:
        self._f.close()


# --- items over the workers ------------------------------------------------------------------------

@dataclass
class WorkerStats:
    """What one worker (a board, or a host side) did: items, time spent on them, why it left the run."""

    name: str
    items: int = 0
    busy_s: float = 0.0
    error: str = ""

    @property
    def per_s(self) -> float:
        """Items per second of its own working time."""
        return self.items / self.busy_s if self.busy_s else 0.0


def run_items(workers: Mapping[str, object], items: Sequence[Item], charset: Sequence[str],
              on_result: Callable[[str, Item, dict], None], stats: Dict[str, WorkerStats]) -> None:
    """Every item on one of the workers (``map_with_failover``); ``on_result(worker, item, record)`` as each ends.

    A worker lost mid-item (BOARD_LOST) leaves the run with its reason in
    ``stats``; its item goes to another worker.
    """
    from bpuemu.board.farm import BOARD_LOST, map_with_failover

    def work(side, item: Item):
        t0 = time.perf_counter()
        try:
            rec = run_item(side, charset, item)
        except BOARD_LOST as exc:
            stats[side.name].error = exc.message.splitlines()[0]
            raise
        return side.name, time.perf_counter() - t0, rec

    for index, (name, seconds, rec) in map_with_failover(workers, work, items):
        stats[name].items += 1
        stats[name].busy_s += seconds
        on_result(name, items[index], rec)


# --- scoring and the report -----------------------------------------------------------------------

def score_side(items: Sequence[Item], done: Dict[str, dict]) -> Dict[str, float]:
    det, cls, rec, e2e = metrics.DetectionScore(), metrics.CountScore(), metrics.RecognitionScore(), metrics.CountScore()
    for it in items:
        rec_ = done.get(it.key)
        if rec_ is None:
            continue
        pred = rec_["pred"]
        if it.kind == "page":
            det.add(pred["boxes"], it.boxes)
            e2e.add(metrics.lines_read(list(zip(pred["boxes"], pred["texts"])), it.boxes, it.texts), len(it.boxes))
        else:
            cls.add(int(pred["angle"] == it.angle))
            rec.add(pred["text"], it.text)
    return metrics.scores(det, cls, rec, e2e)


@dataclass
class Report:
    items: int
    scores: Dict[str, Dict[str, float]]          # side -> metric -> value
    counts: Dict[str, int]                        # side -> items with a result
    agreement: Optional[Dict[str, object]] = None  # board vs quantized
    read_differently: Optional[Dict[str, object]] = None  # recognised lines, quantized vs float
    boards: List[WorkerStats] = field(default_factory=list)
    resumed: Dict[str, int] = field(default_factory=dict)  # side -> items read back from the results file
    seconds: Dict[str, float] = field(default_factory=dict)

    def quantized_drop(self) -> Dict[str, float]:
        """Points (percent) the quantized model loses against float, per metric."""
        f, q = self.scores.get("float"), self.scores.get("quantized")
        if not f or not q:
            return {}
        return {k: 100 * (f[k] - q[k]) for k in f if k in q}

    def table(self) -> str:
        sides = [s for s in SIDES if s in self.scores]
        rows = [f"{'metric':34s}" + "".join(f"{s:>11s}" for s in sides)]
        for key, label in metrics.METRICS:
            if any(key in self.scores[s] for s in sides):
                rows.append(f"{label:34s}" + "".join(
                    f"{100 * self.scores[s][key]:10.2f}%" if key in self.scores[s] else f"{'-':>11s}" for s in sides))
        rows.append(f"{'items':34s}" + "".join(f"{self.counts[s]:>11d}" for s in sides))
        return "\n".join(rows)

    def to_json(self) -> dict:
        return {"items": self.items, "scores": self.scores, "counts": self.counts, "agreement": self.agreement,
                "read_differently": self.read_differently,
                "quantized_drop_points": self.quantized_drop(),
                "boards": [{"board": b.name, "items": b.items, "busy_s": round(b.busy_s, 3),
                            "items_per_s": round(b.per_s, 2), "error": b.error} for b in self.boards],
                "resumed": self.resumed, "seconds": self.seconds}


def agreement(items: Sequence[Item], board: Dict[str, dict], quantized: Dict[str, dict]) -> Dict[str, object]:
    """Board vs quantized ONNX on every item both have: predictions and raw outputs must be identical."""
    both = [it.key for it in items if it.key in board and it.key in quantized]
    differ = [k for k in both if board[k]["pred"] != quantized[k]["pred"] or board[k]["digest"] != quantized[k]["digest"]]
    return {"compared": len(both), "identical": len(both) - len(differ), "differ": differ}


def read_differently(items: Sequence[Item], float_: Dict[str, dict], quantized: Dict[str, dict]) -> Dict[str, object]:
    """Quantized vs float on the recogniser, without the labels: the lines (of those both have) whose text, ends
    stripped as the metrics strip them, differs. Exact match moves by at most this many lines either way; on a
    set where many lines are near a tie (a space barely winning over the blank) it says more than the metric."""
    both = [it.key for it in items if it.kind == "line" and it.key in float_ and it.key in quantized]
    differ = [k for k in both if float_[k]["pred"]["text"].strip() != quantized[k]["pred"]["text"].strip()]
    return {"compared": len(both), "differ": differ}


def evaluate(models: OcrModels, split_dir: str, results: str, sides: Sequence[str] = SIDES,
             boards: Sequence[str] = (), pages: Optional[int] = None, lines: Optional[int] = None,
             access=None, progress: bool = True, echo: Callable[[str], None] = print) -> Report:
    """Run what the results file lacks on each side, then score every side from the file."""
    from tqdm import tqdm

    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        raise InvalidInput(f"unknown side(s) {unknown}; choose from {', '.join(SIDES)}")
    if "board" in sides and not boards:
        raise InvalidInput("the board side needs at least one board", subject="board")
    items = load_items(split_dir, pages, lines)
    store = ResultsFile(results, _fingerprint(models, split_dir))
    report = Report(len(items), {}, {})
    try:
        for side in sides:
            todo = [it for it in items if it.key not in store.done[side]]
            report.resumed[side] = len(items) - len(todo)
            if report.resumed[side]:
                echo(f"{side}: {report.resumed[side]} of {len(items)} item(s) already in {results}; "
                     f"running the other {len(todo)}")
            t0 = time.perf_counter()
            if todo:
                bar = tqdm(total=len(todo), desc=side, unit="img", disable=not progress, leave=False)

                def on_result(worker: str, it: Item, rec: dict, side=side, bar=bar) -> None:
                    store.add(side, {**rec, "worker": worker})
                    bar.update(1)

                try:
                    if side == "board":
                        report.boards = _on_boards(models, boards, access, todo, on_result)
                    else:
                        run_items({side: OnnxSide(models, side)}, todo, models.charset, on_result,
                                  {side: WorkerStats(side)})
                finally:
                    bar.close()
            report.seconds[side] = round(time.perf_counter() - t0, 3)
            report.scores[side] = score_side(items, store.done[side])
            report.counts[side] = sum(it.key in store.done[side] for it in items)
        if "board" in sides and "quantized" in sides:
            report.agreement = agreement(items, store.done["board"], store.done["quantized"])
        if "float" in sides and "quantized" in sides:
            report.read_differently = read_differently(items, store.done["float"], store.done["quantized"])
    finally:
        store.close()
    return report


def _on_boards(models: OcrModels, boards: Sequence[str], access, todo: Sequence[Item],
               on_result: Callable[[str, Item, dict], None]) -> List[WorkerStats]:
    """The board side: every board opened (upload + load of the three .bin) in parallel, then the items spread."""
    from bpuemu.board.farm import BoardAccess, FarmClient

    access = access or BoardAccess(client_name="bpuemu-ocr-eval")
    stats = {b: WorkerStats(b) for b in boards}
    with FarmClient(list(boards), [models.converted(k).bin for k in MODELS], access) as farm:
        workers = {}
        for o in farm.boards():
            if o.ok:
                workers[o.target] = BoardSide(o.target, o.value, models)
            else:
                stats[o.target].error = o.error.message.splitlines()[0]
        if not workers:
            raise type(farm.boards()[0].error)(
                "no board could be opened: " + "; ".join(f"{s.name}: {s.error}" for s in stats.values()))
        run_items(workers, todo, models.charset, on_result, stats)
    return [stats[b] for b in boards]


@contextlib.contextmanager
def local_boards(count: int, workdir: str, echo: Callable[[str], None] = print):
    """``count`` hrt_boardd daemons on free loopback ports for the run (the embedded default); their targets."""
    from bpuemu.host.samples.daemon import running_daemon

    with contextlib.ExitStack() as stack:
        targets = []
        for i in range(count):
            d = os.path.join(workdir, f"board{i}")
            targets.append(stack.enter_context(running_daemon(d, os.path.join(d, "hrt_boardd.log"), echo=echo)))
        yield targets


def _fingerprint(models: OcrModels, split_dir: str) -> str:
    """The models' files and the evaluation set's labels: results of other ones are not resumed from."""
    h = hashlib.sha256(models.fingerprint().encode())
    for name in ("pages.json", "lines.json"):
        path = os.path.join(split_dir, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()

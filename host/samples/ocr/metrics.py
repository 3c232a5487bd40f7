"""The OCR task metrics: what a user of each model measures, on known answers.

* detection: text boxes matched one to one to the page's known line boxes at
  IoU >= 0.5 (highest IoU first); precision = matched / predicted, recall =
  matched / known, H-mean = their harmonic mean;
* texts are compared without spaces at their ends (the recogniser's space
  class often opens or closes a line; PaddleOCR's own evaluation strips too);
* direction: accuracy of the 0/180 answer;
* recognition: exact match (the whole line right), and character accuracy
  over the set, 1 - (sum of edit distances) / (sum of known lengths), floored
  at 0;
* end to end (det -> crop -> cls -> rec): a known line is read when a box
  matched to it carries exactly its text; accuracy = read / known lines.

Scores are fractions in [0, 1]; reports print them as percentages.
"""
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

Box = Sequence[float]  # x0, y0, x1, y1

IOU_MATCH = 0.5


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two axis-aligned boxes (x0, y0, x1, y1)."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match_boxes(predicted: Sequence[Box], known: Sequence[Box], threshold: float = IOU_MATCH) -> List[Tuple[int, int]]:
    """One-to-one (predicted index, known index) pairs with IoU >= threshold, best pairs first."""
    pairs = sorted(((iou(p, k), i, j) for i, p in enumerate(predicted) for j, k in enumerate(known)),
                   key=lambda t: (-t[0], t[1], t[2]))
    used_p, used_k, matches = set(), set(), []
    for v, i, j in pairs:
        if v < threshold:
            break
        if i not in used_p and j not in used_k:
            used_p.add(i)
            used_k.add(j)
            matches.append((i, j))
    return matches


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


@dataclass
class DetectionScore:
    matched: int = 0
    predicted: int = 0
    known: int = 0

    def add(self, predicted: Sequence[Box], known: Sequence[Box]) -> None:
        self.matched += len(match_boxes(predicted, known))
        self.predicted += len(predicted)
        self.known += len(known)

    @property
    def precision(self) -> float:
        return _ratio(self.matched, self.predicted)

    @property
    def recall(self) -> float:
        return _ratio(self.matched, self.known)

    @property
    def hmean(self) -> float:
        p, r = self.precision, self.recall
        return _ratio(2 * p * r, p + r)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions each cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


@dataclass
class RecognitionScore:
    lines: int = 0
    exact: int = 0
    edits: int = 0
    chars: int = 0

    def add(self, predicted: str, known: str) -> None:
        predicted, known = predicted.strip(), known.strip()
        self.lines += 1
        self.exact += predicted == known
        self.edits += edit_distance(predicted, known)
        self.chars += len(known)

    @property
    def exact_match(self) -> float:
        return _ratio(self.exact, self.lines)

    @property
    def char_accuracy(self) -> float:
        return max(0.0, 1.0 - _ratio(self.edits, self.chars)) if self.chars else 0.0


@dataclass
class CountScore:
    """A plain accuracy: right / total (direction, end-to-end lines)."""

    right: int = 0
    total: int = 0

    def add(self, right: int, total: int = 1) -> None:
        self.right += right
        self.total += total

    @property
    def accuracy(self) -> float:
        return _ratio(self.right, self.total)


def lines_read(predicted: Sequence[Tuple[Box, str]], known_boxes: Sequence[Box], known_texts: Sequence[str]) -> int:
    """End to end: how many known lines a matched predicted box reads exactly."""
    matches = match_boxes([b for b, _ in predicted], known_boxes)
    return sum(predicted[i][1].strip() == known_texts[j].strip() for i, j in matches)


#: The report's rows: (key, what the user reads).
METRICS = (
    ("det_precision", "detection precision (IoU >= 0.5)"),
    ("det_recall", "detection recall"),
    ("det_hmean", "detection H-mean"),
    ("cls_accuracy", "direction accuracy"),
    ("rec_exact_match", "recognition exact match"),
    ("rec_char_accuracy", "recognition character accuracy"),
    ("e2e_accuracy", "end-to-end text accuracy"),
)


def scores(det: DetectionScore, cls: CountScore, rec: RecognitionScore, e2e: CountScore) -> Dict[str, float]:
    """Every metric of one side, keyed as METRICS; a metric with nothing measured is left out."""
    out = {}
    if det.known or det.predicted:
        out.update(det_precision=det.precision, det_recall=det.recall, det_hmean=det.hmean)
    if cls.total:
        out["cls_accuracy"] = cls.accuracy
    if rec.lines:
        out.update(rec_exact_match=rec.exact_match, rec_char_accuracy=rec.char_accuracy)
    if e2e.total:
        out["e2e_accuracy"] = e2e.accuracy
    return out

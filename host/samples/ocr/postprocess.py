"""From the three PP-OCR models' outputs to what a user reads: text boxes, a direction, a string.

    boxes = det_boxes(prob_map, (page_h, page_w))            # DB decoding -> [TextBox(x0, y0, x1, y1, score)]
    angle, score = cls_direction(cls_logits)                   # 0 or 180
    text, conf = ctc_greedy(rec_logits, charset)               # charset: the recogniser's character list

DB decoding follows PaddleOCR's ``DBPostProcess`` with the settings RapidOCR
ships for PP-OCRv4 (``thresh`` 0.3, ``box_thresh`` 0.5, ``unclip_ratio`` 1.6,
``use_dilation``, ``score_mode: fast``), simplified to axis-aligned boxes:

* the probability map is thresholded and dilated with a 2x2 kernel (as
  ``cv2.dilate`` does it, anchor at the kernel centre);
* each 8-connected component is one candidate (PaddleOCR takes every contour
  of the mask; a filled text blob has only its outer one);
* the candidate's box is its bounding box (PaddleOCR: the minimum-area
  rotated rectangle of the contour; the same for horizontal text), with sides
  measured between pixel centres as a contour's are; one under ``min_size``
  (3) pixels is dropped;
* its score is the mean probability inside the box; under ``box_thresh`` it is
  dropped;
* unclip: the box grows by ``area * unclip_ratio / perimeter`` on every side
  (pyclipper's round-joined offset of a rectangle has exactly this bounding
  box), and is dropped if its short side is under ``min_size + 2``;
* it is scaled from the map to the page (by the resize ratio: the sample's
  preprocessing fits the page into the input and pads it) and rounded
  (``np.round``) and clipped as PaddleOCR does.

The direction classifier's two classes are ``['0', '180']``; PaddleOCR turns
a line over only when the 180 class scores above ``cls_thresh`` (0.9).

CTC greedy decoding is PaddleOCR's ``CTCLabelDecode``: argmax per time step,
repeats merged, index 0 is the CTC blank, and the recogniser's character list
(from its ONNX metadata) is preceded by the blank and followed by a space.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

#: PaddleOCR's defaults for PP-OCRv4 detection as RapidOCR 1.4.4 ships them.
DB_THRESH = 0.3
DB_BOX_THRESH = 0.5
DB_UNCLIP_RATIO = 1.6
DB_MIN_SIZE = 3
DB_MAX_CANDIDATES = 1000

#: The direction classifier's labels, and the score above which a line is turned over.
CLS_LABELS = (0, 180)
CLS_THRESH = 0.9


@dataclass(frozen=True)
class TextBox:
    """An axis-aligned text box in page pixels (x1, y1 exclusive of nothing: PaddleOCR's corner points)."""

    x0: int
    y0: int
    x1: int
    y1: int
    score: float = 1.0

    @property
    def xyxy(self) -> Tuple[int, int, int, int]:
        return (self.x0, self.y0, self.x1, self.y1)


def _dilate_2x2(mask: np.ndarray) -> np.ndarray:
    """cv2.dilate with a 2x2 kernel of ones: out[y, x] = max(mask[y-1:y+1, x-1:x+1])."""
    out = mask.copy()
    out[1:, :] |= mask[:-1, :]
    out[:, 1:] |= mask[:, :-1]
    out[1:, 1:] |= mask[:-1, :-1]
    return out


def _runs(mask: np.ndarray):
    """Horizontal runs of set pixels: arrays (row, start, end_exclusive), ordered by row then start."""
    h, w = mask.shape
    padded = np.zeros((h, w + 2), dtype=np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    rows_s, starts = np.nonzero(edges == 1)
    rows_e, ends = np.nonzero(edges == -1)
    # nonzero walks row-major, so starts and ends pair up in order
    return rows_s, starts, ends


def components(mask: np.ndarray) -> List[Tuple[int, int, int, int]]:
    """Bounding boxes (x0, y0, x1, y1, inclusive pixel coordinates) of the mask's 8-connected components.

    Run-length labelling: runs on adjacent rows that touch (8-connectivity:
    overlapping or meeting at a corner) are joined with a union-find. Ordered
    by their first pixel (top to bottom, left to right).
    """
    rows, starts, ends = _runs(np.asarray(mask, dtype=bool))
    n = len(rows)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    row_first = np.searchsorted(rows, np.arange(mask.shape[0] + 1))
    for y in range(1, mask.shape[0]):
        a0, a1 = row_first[y - 1], row_first[y]  # runs of the row above
        b0, b1 = row_first[y], row_first[y + 1]
        if a0 == a1 or b0 == b1:
            continue
        i, j = a0, b0
        while i < a1 and j < b1:
            # 8-connected: [s, e) runs touch when s_a <= e_b and s_b <= e_a (a one-pixel diagonal step)
            if starts[i] <= ends[j] and starts[j] <= ends[i]:
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
            if ends[i] < ends[j]:
                i += 1
            else:
                j += 1
    boxes = {}
    for k in range(n):
        r = find(k)
        x0, y0, x1, y1 = starts[k], rows[k], ends[k] - 1, rows[k]
        if r in boxes:
            b = boxes[r]
            boxes[r] = (min(b[0], x0), min(b[1], y0), max(b[2], x1), max(b[3], y1))
        else:
            boxes[r] = (x0, y0, x1, y1)
    return [tuple(int(v) for v in boxes[r]) for r in sorted(boxes)]


def det_boxes(prob: np.ndarray, page_hw: Tuple[int, int], ratio: Optional[Tuple[float, float]] = None,
              thresh: float = DB_THRESH, box_thresh: float = DB_BOX_THRESH, unclip_ratio: float = DB_UNCLIP_RATIO,
              min_size: int = DB_MIN_SIZE, max_candidates: int = DB_MAX_CANDIDATES) -> List[TextBox]:
    """DB decoding of one probability map (1x1xHxW, 1xHxW or HxW) into boxes on a page of ``page_hw`` pixels.

    ``ratio`` (ry, rx): map pixels per page pixel (a page fitted into the
    detector's input and padded); by default the map covers the whole page.
    """
    prob = np.asarray(prob, dtype=np.float32)
    prob = prob.reshape(prob.shape[-2:])
    height, width = prob.shape
    page_h, page_w = page_hw
    ry, rx = ratio if ratio is not None else (height / page_h, width / page_w)
    mask = _dilate_2x2(prob > thresh)
    found = []
    for x0, y0, x1, y1 in components(mask)[:max_candidates]:
        w, h = x1 - x0, y1 - y0  # between pixel centres, as a contour's rectangle measures
        if min(w, h) < min_size:
            continue
        score = float(prob[y0:y1 + 1, x0:x1 + 1].mean())
        if score < box_thresh:
            continue
        d = (w * h) * unclip_ratio / (2.0 * (w + h))
        ux0, uy0, ux1, uy1 = x0 - d, y0 - d, x1 + d, y1 + d
        if min(ux1 - ux0, uy1 - uy0) < min_size + 2:
            continue
        sx, sy = 1.0 / rx, 1.0 / ry
        bx0, bx1 = (int(np.clip(np.round(v * sx), 0, page_w)) for v in (ux0, ux1))
        by0, by1 = (int(np.clip(np.round(v * sy), 0, page_h)) for v in (uy0, uy1))
        if bx1 - bx0 <= 3 or by1 - by0 <= 3:  # PaddleOCR's filter_tag_det_res
            continue
        found.append(TextBox(bx0, by0, bx1, by1, score))
    return found


def cls_direction(logits: np.ndarray) -> Tuple[int, float]:
    """The direction classifier's answer for one line: (0 or 180, that class's score)."""
    scores = np.asarray(logits, dtype=np.float32).reshape(-1)
    if scores.size != len(CLS_LABELS):
        raise ValueError(f"the direction classifier gives {len(CLS_LABELS)} scores, got {scores.size}")
    k = int(np.argmax(scores))
    return CLS_LABELS[k], float(scores[k])


def turn_over(angle: int, score: float, cls_thresh: float = CLS_THRESH) -> bool:
    """PaddleOCR's rule: a line is turned by 180 degrees only when the classifier is sure."""
    return angle == 180 and score > cls_thresh


def ctc_dictionary(charset: Sequence[str]) -> List[str]:
    """The recogniser's output classes: blank, the character list, then a space (PaddleOCR's use_space_char)."""
    return ["blank", *charset, " "]


def ctc_greedy(logits: np.ndarray, charset: Sequence[str]) -> Tuple[str, float]:
    """CTC greedy decoding of one line's logits (1xTxC or TxC): (text, mean probability of the kept steps).

    ``charset`` is the character list as the model's metadata holds it
    (without the blank and the space; see ``ctc_dictionary``).
    """
    probs = np.asarray(logits, dtype=np.float32)
    probs = probs.reshape(probs.shape[-2:])
    classes = ctc_dictionary(charset)
    if probs.shape[1] != len(classes):
        raise ValueError(f"the recogniser has {probs.shape[1]} classes, the character list gives {len(classes)}")
    idx = probs.argmax(axis=1)
    keep = np.ones(len(idx), dtype=bool)
    keep[1:] = idx[1:] != idx[:-1]
    keep &= idx != 0
    text = "".join(classes[i] for i in idx[keep])
    conf = float(probs.max(axis=1)[keep].mean()) if keep.any() else 0.0
    return text, conf

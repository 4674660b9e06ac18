"""Custom ops: TFLite_Detection_PostProcess (SSD box decoding and non-max suppression).

(MediaPipe's Convolution2DTransposeBias lives with the convolutions in conv.py.)
"""

from __future__ import annotations

import numpy as np

from delegate.plugin_api import Op, detection_postprocess_options

from ..registry import kernel
from .common import dequantize_array


def decode_boxes(encodings: np.ndarray, anchors: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Centre-size encodings (y, x, h, w) relative to anchors -> corners (ymin, xmin, ymax, xmax).

    Computed in double precision and rounded once, as TFLite does.
    """
    enc = encodings[:, :4].astype(np.float64) / scales
    anc = anchors.astype(np.float64)
    centre_y = (enc[:, 0] * anc[:, 2] + anc[:, 0]).astype(np.float32)
    centre_x = (enc[:, 1] * anc[:, 3] + anc[:, 1]).astype(np.float32)
    half_h = (0.5 * np.exp(enc[:, 2]) * anc[:, 2]).astype(np.float32)
    half_w = (0.5 * np.exp(enc[:, 3]) * anc[:, 3]).astype(np.float32)
    return np.stack([centre_y - half_h, centre_x - half_w, centre_y + half_h, centre_x + half_w], axis=1)


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Intersection over union of one box with many, in float32 (0 when either area is not positive)."""
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    inter_h = np.maximum(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), np.float32(0))
    inter_w = np.maximum(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), np.float32(0))
    inter = inter_h * inter_w
    with np.errstate(divide="ignore", invalid="ignore"):
        result = inter / (area + areas - inter)
    return np.where((area > 0) & (areas > 0), result, np.float32(0))


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray, score_threshold: float, iou_threshold: float,
                        limit: int) -> np.ndarray:
    """Indices of kept boxes, best first: greedy NMS over the boxes scoring at least the threshold."""
    candidates = np.flatnonzero(scores >= score_threshold)
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    active = np.ones(order.size, bool)
    selected = []
    for i in range(order.size):
        if len(selected) >= limit:
            break
        if not active[i]:
            continue
        selected.append(order[i])
        rest = np.flatnonzero(active[i + 1:]) + i + 1
        if rest.size:
            active[rest[iou(boxes[order[i]], boxes[order[rest]]) > iou_threshold]] = False
    return np.asarray(selected, np.int64)


def _top(values: np.ndarray, count: int) -> np.ndarray:
    """Indices of the ``count`` largest values, largest first (the first maximum wins a tie for top-1)."""
    if count == 1:
        return np.argmax(values, axis=-1)[..., None]
    return np.argsort(-values, axis=-1, kind="stable")[..., :count]


@kernel("TFLite_Detection_PostProcess")
@kernel("TFLite_Detection_PostProcess", quantized=True)  # uint8 heads: dequantized, then the same float NMS
def detection_postprocess(op: Op):
    o = detection_postprocess_options(op.custom_options)
    max_detections = int(o["max_detections"])
    per_detection = int(o["max_classes_per_detection"])
    per_class = int(o["detections_per_class"])
    num_classes = int(o["num_classes"])
    score_threshold = np.float32(o["nms_score_threshold"])
    iou_threshold = np.float32(o["nms_iou_threshold"])
    scales = np.array([o["y_scale"], o["x_scale"], o["h_scale"], o["w_scale"]], np.float32).astype(np.float64)
    regular = bool(o["use_regular_nms"])

    def nms(boxes, scores, limit):
        return non_max_suppression(boxes, scores, score_threshold, iou_threshold, limit)

    def real(i, value):
        """uint8 encodings, scores and anchors (quantized SSD heads) are dequantized first."""
        return dequantize_array(value, op.inputs[i]) if value.dtype.kind in "iu" else value

    def run(ins, outs):
        encodings, predictions, anchors = (real(i, x) for i, x in enumerate(ins[:3]))
        boxes = decode_boxes(encodings[0], anchors, scales)
        # A background column, when present, comes first and is skipped.
        scores = predictions[0][:, predictions.shape[2] - num_classes:]
        out_boxes, out_classes, out_scores, out_count = (x.reshape(-1, *x.shape[2:]) for x in outs)
        for out in (out_boxes, out_classes, out_scores):
            out.fill(0)
        if regular:
            anchor, cls = _regular(boxes, scores, per_class, max_detections, nms)
            slots, count = np.arange(anchor.size), anchor.size
        else:
            anchor, cls, slots = _fast(boxes, scores, per_detection, max_detections, nms)
            count = anchor.size // max(min(per_detection, num_classes), 1)
        out_boxes[slots] = boxes[anchor]
        out_classes[slots] = cls
        out_scores[slots] = scores[anchor, cls]
        out_count[0] = count
    return run


def _regular(boxes, scores, per_class, max_detections, nms):
    """NMS per class, then the best ``max_detections`` of all classes' survivors."""
    anchors, classes, kept_scores = [], [], []
    for c in range(scores.shape[1]):
        keep = nms(boxes, scores[:, c], per_class)
        anchors.append(keep)
        classes.append(np.full(keep.size, c))
        kept_scores.append(scores[keep, c])
    anchor, cls, score = (np.concatenate(v) for v in (anchors, classes, kept_scores))
    best = np.argsort(-score, kind="stable")[:max_detections]
    return anchor[best], cls[best]


def _fast(boxes, scores, per_detection, max_detections, nms):
    """NMS once on each anchor's best class score; each kept anchor reports its top classes.

    Returns (anchor, class, output slot) per reported detection; kept anchor k fills the slots
    from k * per_detection on.
    """
    count = min(per_detection, scores.shape[1])
    top = _top(scores, count)
    keep = nms(boxes, scores[np.arange(scores.shape[0]), top[:, 0]], max_detections)
    slots = (np.arange(keep.size)[:, None] * per_detection + np.arange(count)).ravel()
    return np.repeat(keep, count), top[keep].ravel(), slots

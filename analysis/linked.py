"""The report's linked views: every chart reads three shared signals, set by the page's script
(analysis/templates/report.html.j2) when a legend entry, a depth header or a filter chip is
clicked, or an LR range is brushed on the loss or headline chart:

- arms_shown: the arm labels to show (null: all). Charts with an arm colour keep their legend
  (its scale domain is fixed) while the data of other arms is filtered out; the headline and
  keeps the rows comparing off with a chosen arm (all rows when off is chosen).
- depths_shown: the depths to show (null: all); faceted charts drop the other depth panels.
- lr_range: [low, high] from the LR brush (null: every LR); the training curves and probe
  charts keep the LRs inside it.

A chart's spec gets the signals as top-level variable params and one filter transform that
reads them, so the same spec works alone (charts/*.html): there every signal stays null.
"""

from __future__ import annotations

from .charts import OFF_LABEL

ARMS, DEPTHS, LR_RANGE = "arms_shown", "depths_shown", "lr_range"
BRUSH = "lr_brush"  # the interval selection on the LR axis of the loss and headline charts
COMPARED_PREFIX = "off minus "

# chart -> (the field holding its arm label, or "compared" for off-minus-arm rows; whether the
# LR brush filters it)
LINKS = {
    "headline": ("compared", False),
    "loss_vs_lr": ("arm", False),
    "training_curves": ("arm", True),
    "max_attention_logit": ("arm", True),
    "attention_entropy": ("arm", True),
    "other_probes": ("arm", True),
    "lr_sensitivity": ("arm", False),
    "lr_landmarks": ("arm", False),
}


def filter_expression(arm_field: str, by_lr: bool) -> str:
    """The Vega expression that keeps a datum under the current arms, depths and LR range."""
    if arm_field == "compared":
        n = len(COMPARED_PREFIX)
        arm = (f"!{ARMS} || indexof({ARMS}, '{OFF_LABEL}') >= 0 || !datum.compared"
               f" || indexof({ARMS}, slice(datum.compared, {n})) >= 0")
    else:  # a landmark's onset row is no arm's: it stays
        arm = (f"!{ARMS} || !datum.{arm_field} || indexof({ARMS}, datum.{arm_field}) >= 0"
               f" || indexof(datum.{arm_field}, 'onset') == 0")
    parts = [f"({arm})", f"(!{DEPTHS} || datum.depth == null"
                         f" || indexof({DEPTHS}, datum.depth) >= 0)"]
    if by_lr:
        parts.append(f"(!{LR_RANGE} || datum.lr == null"
                     f" || (datum.lr >= {LR_RANGE}[0] && datum.lr <= {LR_RANGE}[1]))")
    return " && ".join(parts)


def link(name: str, spec: dict) -> dict:
    """`spec` (a chart's Vega-Lite dict) reading the shared signals; charts not in LINKS (an
    empty chart's message) are returned as they are."""
    if name not in LINKS or "data" not in spec:
        return spec
    arm_field, by_lr = LINKS[name]
    out = dict(spec)
    out["params"] = [*spec.get("params", []),
                     *({"name": n, "value": None} for n in (ARMS, DEPTHS, LR_RANGE))]
    out["transform"] = [{"filter": filter_expression(arm_field, by_lr)},
                        *spec.get("transform", [])]
    return out

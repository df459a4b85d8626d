# Chart data extraction from matplotlib figures, in E2B's chart format (the "e2b/chart" entry
# of a figure's display bundle). Shared by the ipykernel startup script and the stdlib driver.
# It only reads the figure's artists; it never imports matplotlib itself before the user does
# (callers pass a Figure), and any failure yields None so a plot is never lost to chart data.
import math
import re

_UNIT = re.compile(r"^(.*?)\s*[\(\[]\s*([^\)\]]+?)\s*[\)\]]\s*$")


def _num(v):
    """A JSON-safe Python scalar from a numpy/matplotlib value (NaN/inf → None)."""
    try:
        if hasattr(v, "item"):
            v = v.item()
    except Exception:
        pass
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if hasattr(v, "isoformat"):
        return v.isoformat()
    try:
        f = float(v)
        return f if math.isfinite(f) else None
    except Exception:
        return str(v)


def _label_unit(text):
    # "Time (s)" → ("Time (s)", "s"): E2B keeps the label and reports the unit separately.
    m = _UNIT.match(text or "")
    return (text or "", m.group(2) if m else None)


def _is_date_axis(axis):
    try:
        import matplotlib.dates as mdates

        return isinstance(axis.get_converter() if hasattr(axis, "get_converter") else axis.converter,
                          (mdates.DateConverter, mdates._SwitchableDateConverter, mdates.ConciseDateConverter))
    except Exception:
        return False


def _axis_values(axis, values):
    if _is_date_axis(axis):
        import matplotlib.dates as mdates

        out = []
        for v in values:
            try:
                out.append(mdates.num2date(float(v)).isoformat())
            except Exception:
                out.append(_num(v))
        return out
    return [_num(v) for v in values]


def _user_label(artist):
    label = artist.get_label() or ""
    # matplotlib names unlabelled artists "_child0", "_line0", …: those are not user labels.
    return "" if label.startswith("_") else label


def _two_d(ax, kind):
    x_label, x_unit = _label_unit(ax.get_xlabel())
    y_label, y_unit = _label_unit(ax.get_ylabel())
    return {
        "type": kind,
        "title": ax.get_title() or None,
        "x_label": x_label or None,
        "y_label": y_label or None,
        "x_unit": x_unit,
        "y_unit": y_unit,
        "elements": [],
    }


def _ticks(ax, chart):
    for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        scale = "datetime" if _is_date_axis(axis) else axis.get_scale()
        if scale == "linear" and getattr(axis, "units", None) is not None and \
                type(axis.units).__name__ == "UnitData":
            scale = "categorical"
        chart[name + "_scale"] = scale
        chart[name + "_ticks"] = _axis_values(axis, axis.get_ticklocs())
        chart[name + "_tick_labels"] = [t.get_text() for t in axis.get_ticklabels()]


def _bar_chart(ax, containers):
    chart = _two_d(ax, "bar")
    x_labels = {}
    try:
        for loc, t in zip(ax.get_xticks(), ax.get_xticklabels()):
            x_labels[round(float(loc), 6)] = t.get_text()
    except Exception:
        pass
    for c in containers:
        group = _user_label(c) or ""
        horizontal = getattr(c, "orientation", "vertical") == "horizontal"
        for patch in c.patches:
            if horizontal:
                center = patch.get_y() + patch.get_height() / 2
                value = patch.get_width()
                label = str(_num(center))
            else:
                center = patch.get_x() + patch.get_width() / 2
                value = patch.get_height()
                label = x_labels.get(round(float(center), 6))
                if not label:
                    label = str(_num(center))
            chart["elements"].append({"label": label, "value": _num(value), "group": group})
    return chart


def _pie_chart(ax, wedges):
    chart = {"type": "pie", "title": ax.get_title() or None, "elements": []}
    texts = [t.get_text() for t in ax.texts]
    for i, w in enumerate(wedges):
        label = _user_label(w) or (texts[2 * i] if len(texts) >= 2 * len(wedges) else
                                   (texts[i] if i < len(texts) else ""))
        chart["elements"].append({"label": label, "angle": _num(w.theta2 - w.theta1),
                                  "radius": _num(w.r)})
    return chart


def _box_chart(ax, stats):
    chart = _two_d(ax, "box_and_whisker")
    for i, s in enumerate(stats):
        chart["elements"].append({
            "label": str(s.get("label", i + 1)),
            "min": _num(s.get("whislo")),
            "first_quartile": _num(s.get("q1")),
            "median": _num(s.get("med")),
            "third_quartile": _num(s.get("q3")),
            "max": _num(s.get("whishi")),
            "outliers": [_num(v) for v in s.get("fliers", [])],
        })
    return chart


def chart_from_axes(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    stats = getattr(ax, "_airlock_boxplot_stats", None)
    if stats:
        return _box_chart(ax, stats)
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        return _bar_chart(ax, bars)
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges:
        return _pie_chart(ax, wedges)
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    lines = list(ax.get_lines())
    if scatters and not lines:
        chart = _two_d(ax, "scatter")
        _ticks(ax, chart)
        for i, c in enumerate(scatters):
            offsets = c.get_offsets()
            chart["elements"].append({
                "label": _user_label(c) or "",
                "points": [[_axis_values(ax.xaxis, [p[0]])[0], _axis_values(ax.yaxis, [p[1]])[0]]
                           for p in offsets],
            })
        return chart
    if lines and not scatters:
        chart = _two_d(ax, "line")
        _ticks(ax, chart)
        for line in lines:
            xs = _axis_values(ax.xaxis, line.get_xdata(orig=False))
            ys = _axis_values(ax.yaxis, line.get_ydata(orig=False))
            chart["elements"].append({"label": _user_label(line) or "",
                                      "points": [[x, y] for x, y in zip(xs, ys)]})
        return chart
    return {"type": "unknown", "title": ax.get_title() or None, "elements": []}


def chart_from_figure(fig):
    """The E2B chart object of a figure: one chart per axes, a superchart for several."""
    try:
        axes = [ax for ax in fig.get_axes() if ax.get_visible()]
        if not axes:
            return None
        charts = [chart_from_axes(ax) for ax in axes]
        if len(charts) == 1:
            return charts[0]
        title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
        return {"type": "superchart", "title": title, "elements": charts}
    except Exception:
        return None


def install_boxplot_recorder(axes_class):
    """Make Axes.bxp keep the box statistics it draws, so box plots are recognisable later
    (their artists are plain lines)."""
    if getattr(axes_class.bxp, "_airlock", False):
        return
    orig = axes_class.bxp

    def bxp(self, bxpstats, *args, **kwargs):
        result = orig(self, bxpstats, *args, **kwargs)
        try:
            labels = kwargs.get("labels")
            recorded = []
            for i, s in enumerate(bxpstats):
                s = dict(s)
                if labels is not None and i < len(labels):
                    s["label"] = labels[i]
                recorded.append(s)
            self._airlock_boxplot_stats = getattr(self, "_airlock_boxplot_stats", []) + recorded
        except Exception:
            pass
        return result

    bxp._airlock = True
    axes_class.bxp = bxp

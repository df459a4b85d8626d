# Run once inside ipykernel at start (IPKernelApp.exec_lines execs this file in a private
# namespace, so nothing here lands in the user's namespace). It:
#  - adds an "e2b/chart" formatter so each matplotlib figure's display bundle (one display_data
#    with image/png, produced by the matplotlib-inline backend the Go side selects through
#    MPLBACKEND) also carries E2B chart data;
#  - installs the "_airlock" module used by the Go side to apply per-execution environment
#    variables before a cell and restore them after (two silent executes).
import importlib.util
import os
import sys
import types

_here = os.path.dirname(__file__)
_spec = importlib.util.spec_from_file_location("_airlock_charts", os.path.join(_here, "airlock_charts.py"))
_charts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_charts)
sys.modules["_airlock_charts"] = _charts

_mod = types.ModuleType("_airlock")
_saved = []


def apply_env(env):
    """Set env for one execution, remembering what it replaces (None: was unset)."""
    prev = {k: os.environ.get(k) for k in env}
    _saved.append(prev)
    os.environ.update(env)


def restore_env():
    if not _saved:
        return
    for k, v in _saved.pop().items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_mod.apply_env = apply_env
_mod.restore_env = restore_env
sys.modules["_airlock"] = _mod


def _setup_formatter():
    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class ChartFormatter(BaseFormatter):
        """Chart data for matplotlib figures. It matches figures itself instead of through
        for_type: IPython's select_figure_formats (run when the inline backend loads) pops
        Figure from every formatter's registry."""

        format_type = Unicode("e2b/chart")
        _return_type = dict
        print_method = ObjectName("_repr_e2b_chart_")

        def __call__(self, obj):
            mpl_figure = sys.modules.get("matplotlib.figure")
            if mpl_figure is None or not isinstance(obj, mpl_figure.Figure):
                return None
            return _charts.chart_from_figure(obj)

    shell = get_ipython()
    if shell is None:
        return
    formatter = ChartFormatter(parent=shell.display_formatter)
    shell.display_formatter.formatters["e2b/chart"] = formatter


def _on_import_matplotlib_axes():
    # Box plots are plain lines once drawn; record their statistics when they are made.
    try:
        from matplotlib.axes import Axes

        _charts.install_boxplot_recorder(Axes)
    except Exception:
        pass


class _AxesHook:
    """A meta-path finder that runs a hook once matplotlib.axes is imported (lazily: the
    kernel must not pay for importing matplotlib at start)."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.axes":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        orig = spec.loader.exec_module

        def exec_module(module):
            orig(module)
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            _on_import_matplotlib_axes()

        spec.loader.exec_module = exec_module
        return spec


_setup_formatter()
if "matplotlib.axes" in sys.modules:
    _on_import_matplotlib_axes()
else:
    sys.meta_path.insert(0, _AxesHook())

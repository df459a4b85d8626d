# Run once inside ipykernel at start (IPKernelApp.exec_lines execs this file in a private
# namespace, so nothing here lands in the user's namespace). It:
#  - adds an "e2b/chart" formatter so each matplotlib figure's display bundle (one display_data
#    with image/png, produced by the matplotlib-inline backend the Go side selects through
#    MPLBACKEND) also carries E2B chart data;
#  - adds an "e2b/data" formatter (a pandas DataFrame as {column: [values]}, timestamps in ISO
#    form) and answers application/json for lists and dicts, as E2B's results carry them;
#  - makes PIL's Image.save to a path also display the image, as E2B's sandbox does;
#  - installs the "_airlock" module used by the Go side to apply per-execution environment
#    variables before a cell and restore them after (two silent executes).
import importlib.util
import os
import sys
import types

_here = os.path.dirname(__file__)


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_here, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules[name] = mod
    return mod


_charts = _load("_airlock_charts", "airlock_charts.py")
_results = _load("_airlock_results", "airlock_results.py")

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

    class DataFormatter(BaseFormatter):
        """A DataFrame's columns, for result.data."""

        format_type = Unicode("e2b/data")
        _return_type = dict
        print_method = ObjectName("_repr_e2b_data_")

        def __call__(self, obj):
            return _results.frame_data(obj)

    class JSONFormatter(BaseFormatter):
        """application/json for plain lists and dicts (result.json), and whatever a
        _repr_json_ gives, as IPython's own JSON formatter does."""

        format_type = Unicode("application/json")
        _return_type = (list, dict)
        print_method = ObjectName("_repr_json_")

        def __call__(self, obj):
            if type(obj) in (list, dict):
                return _results.plain_json(obj)
            return super().__call__(obj)

    shell = get_ipython()
    if shell is None:
        return
    formatters = shell.display_formatter.formatters
    formatters["e2b/chart"] = ChartFormatter(parent=shell.display_formatter)
    formatters["e2b/data"] = DataFormatter(parent=shell.display_formatter)
    formatters["application/json"] = JSONFormatter(parent=shell.display_formatter)


def _display_saved_images():
    # E2B's sandbox shows an image the code saves to a file, as if displayed.
    try:
        from IPython.display import display

        Image = sys.modules["PIL.Image"]
    except Exception:
        return
    original = Image.Image.save

    def save(image, fp, format=None, **params):
        if isinstance(fp, (str, os.PathLike)):
            display(image)
        return original(image, fp, format, **params)

    Image.Image.save = save


def _on_import_matplotlib_axes():
    # Box plots are plain lines once drawn; record their statistics when they are made.
    try:
        from matplotlib.axes import Axes

        _charts.install_boxplot_recorder(Axes)
    except Exception:
        pass


class _OnImport:
    """A meta-path finder that runs hook once module name is imported (lazily: the kernel
    must not pay for importing matplotlib or PIL at start)."""

    def __init__(self, name, hook):
        self.name, self.hook = name, hook

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
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
            self.hook()

        spec.loader.exec_module = exec_module
        return spec


def _when_imported(name, hook):
    if name in sys.modules:
        hook()
    else:
        sys.meta_path.insert(0, _OnImport(name, hook))


_setup_formatter()
_when_imported("matplotlib.axes", _on_import_matplotlib_axes)
_when_imported("PIL.Image", _display_saved_images)

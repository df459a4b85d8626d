# Stdlib-only Python driver for templates without ipykernel. Protocol (one JSON object a line):
#   requests on stdin:  {"code": str, "env": {str: str}}
#   events on fd 3:     {"type": "stream", "name": "stdout"|"stderr", "text": str}
#                       {"type": "display_data"|"execute_result", "data": {mime: value}}
#                       {"type": "error", "ename", "evalue", "traceback": [str]}
#                       {"type": "done", "execution_count": int}
# fd 3 is private to the protocol, so whatever user code or its subprocesses write to fd 1/2 can
# never corrupt it; the Go side forwards raw fd 1/2 output as stdout/stderr of the running
# execution. After each cell the driver writes a sentinel line on fd 1 and fd 2 (before "done")
# so the Go side knows it has all of that cell's raw output.
import ast
import asyncio
import base64
import builtins
import codecs
import importlib.util
import inspect
import io
import json
import linecache
import os
import signal
import sys
import traceback
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
_EVENTS = os.fdopen(3, "w", encoding="utf-8", buffering=1)
_SENTINEL = os.environ.pop("AIRLOCK_DRIVER_SENTINEL", "\x1eairlock-done\x1e").encode() + b"\n"

_loaded = {}


def _load(name, file):
    """Loads a support module shipped beside the driver, once, on first use."""
    mod = _loaded.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, file))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
        _loaded[name] = mod
    return mod


def _load_charts():
    return _load("_airlock_charts", "airlock_charts.py")


def _load_results():
    return _load("_airlock_results", "airlock_results.py")


def _send(obj):
    _EVENTS.write(json.dumps(obj, default=str) + "\n")


class _Stream(io.TextIOBase):
    """sys.stdout/sys.stderr replacement: text becomes stream events, flushed at each newline
    and before any other event so ordering between prints and displays is kept."""

    def __init__(self, name, fd):
        self.name_ = name
        self.buf = []
        self._fd = fd

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        # Code that writes to sys.stdout.fileno() (subprocess, faulthandler) gets the raw fd,
        # which the Go side forwards too.
        return self._fd

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if s:
            self.buf.append(s)
            if "\n" in s or sum(map(len, self.buf)) > 8192:
                self.flush()
        return len(s)

    def flush(self):
        if self.buf:
            text = "".join(self.buf)
            self.buf = []
            _send({"type": "stream", "name": self.name_, "text": text})


_stdout = _Stream("stdout", 1)
_stderr = _Stream("stderr", 2)


def _flush_streams():
    _stdout.flush()
    _stderr.flush()


# ---- rich display -------------------------------------------------------------------------

_REPRS = [
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("application/pdf", "_repr_pdf_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
]
_BINARY = {"image/png", "image/jpeg", "application/pdf"}


def _is_figure(obj):
    mpl_figure = sys.modules.get("matplotlib.figure")
    return mpl_figure is not None and isinstance(obj, mpl_figure.Figure)


def _figure_bundle(fig):
    buf = io.BytesIO()
    fig.canvas.print_figure(buf, format="png", bbox_inches="tight")
    bundle = {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"), "text/plain": repr(fig)}
    chart = _load_charts().chart_from_figure(fig)
    if chart is not None:
        bundle["e2b/chart"] = chart
    return bundle


def _bundle(obj):
    """The MIME bundle of obj, as IPython would compute it from the _repr_*_ protocol."""
    if _is_figure(obj):
        return _figure_bundle(obj)
    data = {}
    if inspect.isclass(obj):
        return {"text/plain": repr(obj)}
    method = getattr(obj, "_repr_mimebundle_", None)
    if callable(method):
        try:
            r = method(include=None, exclude=None)
            if isinstance(r, tuple):
                r = r[0]
            if isinstance(r, dict):
                data.update(r)
        except Exception:
            pass
    for mime, name in _REPRS:
        if mime in data:
            continue
        method = getattr(obj, name, None)
        if not callable(method):
            continue
        try:
            r = method()
        except Exception:
            continue
        if isinstance(r, tuple):
            r = r[0]
        if r is None:
            continue
        if mime in _BINARY and isinstance(r, (bytes, bytearray)):
            r = base64.b64encode(r).decode("ascii")
        data[mime] = r
    if "e2b/data" not in data:
        frame = _load_results().frame_data(obj)
        if frame is not None:
            data["e2b/data"] = frame
    if "application/json" not in data:
        plain = _load_results().plain_json(obj)
        if plain is not None:
            data["application/json"] = plain
    for mime in list(data):
        if mime in _BINARY and isinstance(data[mime], (bytes, bytearray)):
            data[mime] = base64.b64encode(data[mime]).decode("ascii")
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:  # a broken __repr__ must not kill the cell's other output
            data["text/plain"] = "<repr failed: %r>" % (e,)
    return data


def display(*objs, raw=False, **kwargs):
    """IPython-compatible display(): each object becomes one display_data event."""
    _flush_streams()
    for obj in objs:
        data = obj if raw else _bundle(obj)
        _send({"type": "display_data", "data": data})


# ---- matplotlib ---------------------------------------------------------------------------

_BACKEND = "module://_airlock_mpl_backend"


def _flush_figures():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for num in pyplot.get_fignums():
        fig = pyplot.figure(num)
        try:
            display(fig)
        finally:
            pyplot.close(fig)


def _make_backend():
    # A matplotlib backend living only in this process (sys.modules), so MPLBACKEND never has
    # to name it and subprocesses keep the template's backend. show() flushes figures as PNG.
    mod = types.ModuleType("_airlock_mpl_backend")

    def init(mod=mod):
        from matplotlib.backends import backend_agg

        mod.FigureCanvas = backend_agg.FigureCanvasAgg
        mod.FigureManager = backend_agg.FigureManagerBase
        mod.new_figure_manager = backend_agg.new_figure_manager
        mod.new_figure_manager_given_figure = backend_agg.new_figure_manager_given_figure
        mod.draw_if_interactive = lambda *a, **k: None
        mod.show = lambda *a, **k: _flush_figures()
        mod.backend_version = getattr(backend_agg, "backend_version", "")

    mod._airlock_init = init
    return mod


def _hook_matplotlib(module):
    sys.modules["_airlock_mpl_backend"]._airlock_init()
    module.rcParams["backend"] = _BACKEND


def _hook_axes(module):
    _load_charts().install_boxplot_recorder(module.Axes)


def _hook_ipython_display(module):
    module.display = display


def _hook_pil_image(module):
    # E2B's sandbox shows an image the code saves to a file, as if displayed.
    original = module.Image.save

    def save(image, fp, format=None, **params):
        if isinstance(fp, (str, os.PathLike)):
            display(image)
        return original(image, fp, format, **params)

    module.Image.save = save


_HOOKS = {
    "matplotlib": _hook_matplotlib,
    "matplotlib.axes": _hook_axes,
    "IPython.core.display_functions": _hook_ipython_display,
    "IPython.core.display": _hook_ipython_display,
    "PIL.Image": _hook_pil_image,
}


class _PostImport:
    """Runs _HOOKS[name] right after module name is executed on first import."""

    def find_spec(self, name, path=None, target=None):
        hook = _HOOKS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        orig = spec.loader.exec_module

        def exec_module(module):
            orig(module)
            try:
                hook(module)
            except Exception:
                pass

        spec.loader.exec_module = exec_module
        return spec


# ---- execution ----------------------------------------------------------------------------

_ns = {"__name__": "__main__", "__builtins__": builtins}
_count = 0
_loop = None


def _loop_get():
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_loop)
    return _loop


def _run(code_obj):
    r = eval(code_obj, _ns)
    if code_obj.co_flags & inspect.CO_COROUTINE:
        r = _loop_get().run_until_complete(r)
    return r


def _send_error(exc):
    _flush_streams()
    tb = exc.__traceback__
    # Drop the driver's own frames from the head of the traceback.
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    if tb is None and not isinstance(exc, SyntaxError):
        lines = traceback.format_exception_only(type(exc), exc)
    _send({"type": "error", "ename": type(exc).__name__, "evalue": str(exc),
           "traceback": "".join(lines).rstrip("\n").split("\n")})


def _execute(code):
    global _count
    _count += 1
    filename = "<cell-%d>" % _count
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | flags)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        if tree.body:
            _run(compile(tree, filename, "exec", flags))
        if last is not None:
            value = _run(compile(last, filename, "eval", flags))
            if value is not None:
                _ns["_"] = value
                _flush_streams()
                _send({"type": "execute_result", "data": _bundle(value)})
        _flush_figures()
    except BaseException as e:  # KeyboardInterrupt and SystemExit are cell errors too
        _send_error(e)
        try:
            _flush_figures()
        except BaseException:
            pass
    _flush_streams()


def _apply_env(env):
    prev = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return prev


def _restore_env(prev):
    for k, v in prev.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def main():
    sys.meta_path.insert(0, _PostImport())
    sys.modules["_airlock_mpl_backend"] = _make_backend()
    for name, hook in _HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])
    builtins.display = display
    stdin = io.TextIOWrapper(os.fdopen(0, "rb", buffering=0), encoding="utf-8")
    sys.stdin = open(os.devnull)
    sys.stdout, sys.stderr = _stdout, _stderr
    sys.argv = [""]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _send({"type": "ready"})
    while True:
        try:
            line = stdin.readline()
        except KeyboardInterrupt:
            continue  # an interrupt that arrived between cells
        if not line:
            return
        try:
            req = json.loads(line)
        except ValueError:
            continue
        prev = {}
        try:
            prev = _apply_env(req.get("env") or {})
            _execute(req.get("code", ""))
        except KeyboardInterrupt:
            pass  # landed after the cell's own handler: the cell is over anyway
        finally:
            _restore_env(prev)
        for f in (sys.__stdout__, sys.__stderr__):  # code that wrote to the real streams
            try:
                f.flush()
            except Exception:
                pass
        try:
            os.write(1, _SENTINEL)
            os.write(2, _SENTINEL)
            _send({"type": "done", "execution_count": _count})
        except KeyboardInterrupt:
            _send({"type": "done", "execution_count": _count})


if __name__ == "__main__":
    main()

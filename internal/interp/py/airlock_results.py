# The result entries E2B adds beyond IPython's own MIME types, shared by the ipykernel startup
# and the stdlib driver: "e2b/data" (a pandas DataFrame as {column: [values]}) and
# application/json for plain lists and dicts. Nothing here imports pandas: a DataFrame can only
# exist once the user imported it.
import json
import sys


def frame_data(obj):
    """A DataFrame's columns as JSON values (missing values null, timestamps ISO), or None."""
    pandas = sys.modules.get("pandas")
    if pandas is None or not isinstance(obj, pandas.DataFrame):
        return None
    out = {}
    for column, values in obj.to_dict(orient="list").items():
        out[str(column)] = [_cell(pandas, v) for v in values]
    return json.loads(json.dumps(out, default=json_default))


def plain_json(obj):
    """A plain list or dict as JSON values, or None (anything else, or not encodable)."""
    if type(obj) not in (list, dict):
        return None
    try:
        return json.loads(json.dumps(obj, default=json_default, allow_nan=False))
    except (TypeError, ValueError):
        return None


def json_default(v):
    """What json cannot encode as is: numpy scalars and arrays, dates; anything else as text."""
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if hasattr(v, "tolist"):
        return v.tolist()
    if hasattr(v, "item"):
        return v.item()
    return str(v)


def _cell(pandas, v):
    # JSON has no NaN, and the wire is JSON.
    try:
        if pandas.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    if isinstance(v, pandas.Timestamp):
        return v.isoformat()
    return v

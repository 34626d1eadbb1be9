"""EC2 query-protocol documents read and written by botocore's own EC2 service model, for the test
stand-in ``tests/aws/ec2front.py``.

- ``decode_request``: the form fields of an EC2 query request (``Filter.1.Value.2=...``) turned back
  into the parameters botocore was given, walking the operation's input shape; then checked the
  way EC2 checks them: a field the shape does not name is ``UnknownParameter``, a required member
  missing is ``MissingParameter``, a value of the wrong type or outside its enum is
  ``InvalidParameterValue``.  The check is a round trip: botocore's EC2 serializer must produce
  exactly the fields received.
- ``encode_response``: a result dict turned into the XML EC2 answers, walking the operation's
  output shape; a key the shape lacks, a value of the wrong type or outside its enum raises
  ``ShapeError`` (the stand-in cannot answer a document botocore would not read as AWS's).
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any
from xml.sax.saxutils import escape

XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"
SKIP_FIELDS = {"Action", "Version"}


class ShapeError(ValueError):
    """A document that does not fit botocore's EC2 model."""


class RequestError(Exception):
    """What EC2 answers a malformed request with (code and message)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@functools.lru_cache(maxsize=1)
def service_model():
    import botocore.loaders
    import botocore.model

    return botocore.model.ServiceModel(botocore.loaders.Loader().load_service_model("ec2", "service-2"), "ec2")


def operation(name: str):
    return service_model().operation_model(name)


# ---- requests --------------------------------------------------------------------------------

def _query_name(shape, default: str) -> str:
    """The field name of a member on input (botocore's EC2Serializer rule)."""
    ser = shape.serialization
    if "queryName" in ser:
        return ser["queryName"]
    if "name" in ser:
        return ser["name"][0].upper() + ser["name"][1:]
    return default


def _scalar(shape, text: str, field: str) -> Any:
    kind = shape.type_name
    try:
        if kind in ("integer", "long"):
            return int(text)
        if kind in ("float", "double"):
            return float(text)
        if kind == "boolean":
            if text not in ("true", "false"):
                raise ValueError(text)
            return text == "true"
        if kind == "timestamp":
            return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise RequestError("InvalidParameterValue", f"Value ({text}) for parameter {field} is invalid") from None
    enum = shape.enum
    if enum and text not in enum:
        raise RequestError("InvalidParameterValue", f"Value ({text}) for parameter {field} is invalid. "
                                                    f"Valid values: {', '.join(enum)}")
    return text


def _has(fields: dict[str, str], key: str) -> bool:
    return any(f == key or f.startswith(key + ".") for f in fields)


def _decode(shape, fields: dict[str, str], key: str) -> Any:
    """The value whose field name is ``key`` ("" for the request itself)."""
    kind = shape.type_name
    if kind == "structure":
        out = {}
        for name, member in shape.members.items():
            child = f"{key}.{_query_name(member, name)}" if key else _query_name(member, name)
            if _has(fields, child):
                out[name] = _decode(member, fields, child)
        return out
    if kind == "list":
        items, i = [], 1
        while _has(fields, f"{key}.{i}"):
            items.append(_decode(shape.member, fields, f"{key}.{i}"))
            i += 1
        return items
    if kind == "map" or key not in fields:
        raise RequestError("InvalidParameterValue", f"parameter {key} has no usable value")
    return _scalar(shape, fields[key], key)


def decode_request(op_name: str, fields: dict[str, str]) -> dict[str, Any]:
    """The parameters of an EC2 query request, checked against the operation's input shape."""
    import botocore.serialize
    import botocore.validate

    model = operation(op_name)
    shape = model.input_shape
    given = {k: v for k, v in fields.items() if k not in SKIP_FIELDS}
    params = _decode(shape, given, "") if shape is not None else {}
    for name in (shape.required_members if shape is not None else []):
        if name not in params:
            raise RequestError("MissingParameter", f"The request must contain the parameter {name}")
    report = botocore.validate.ParamValidator().validate(params, shape) if shape is not None else None
    if report is not None and report.has_errors():
        raise RequestError("InvalidParameterValue", " ".join(report.generate_report().split()))
    again = botocore.serialize.create_serializer("ec2").serialize_to_request(params, model)["body"]
    unknown = sorted(set(given) - set(again) - SKIP_FIELDS)
    if unknown:
        raise RequestError("UnknownParameter", f"The parameter {unknown[0]} is not recognized")
    return params


# ---- responses -------------------------------------------------------------------------------

def _timestamp(value: Any, where: str) -> str:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise ShapeError(f"{where}: expected an aware datetime, got {value!r}")
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _text(shape, value: Any, where: str) -> str:
    kind = shape.type_name
    if kind == "boolean":
        if not isinstance(value, bool):
            raise ShapeError(f"{where}: expected a boolean, got {value!r}")
        return "true" if value else "false"
    if kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ShapeError(f"{where}: expected an integer, got {value!r}")
        return str(value)
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ShapeError(f"{where}: expected a number, got {value!r}")
        return repr(float(value))
    if kind == "timestamp":
        return _timestamp(value, where)
    if kind == "string":
        if not isinstance(value, str):
            raise ShapeError(f"{where}: expected a string, got {value!r}")
        if shape.enum and value not in shape.enum:
            raise ShapeError(f"{where}: {value!r} is not one of {list(shape.enum)}")
        return escape(value)
    raise ShapeError(f"{where}: the stand-in does not write {kind} values")


def _encode(shape, value: Any, where: str) -> str:
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            raise ShapeError(f"{where}: expected a structure (dict), got {value!r}")
        parts = []
        for name, item in value.items():
            if name not in shape.members:
                raise ShapeError(f"{where}: {shape.name} has no member {name!r}")
            if item is None:
                continue
            member = shape.members[name]
            tag = member.serialization.get("name", name)
            parts.append(f"<{tag}>{_encode(member, item, f'{where}.{name}')}</{tag}>")
        return "".join(parts)
    if kind == "list":
        if not isinstance(value, (list, tuple)):
            raise ShapeError(f"{where}: expected a list, got {value!r}")
        tag = shape.member.serialization.get("name", "member")
        return "".join(f"<{tag}>{_encode(shape.member, item, f'{where}[{i}]')}</{tag}>" for i, item in enumerate(value))
    return _text(shape, value, where)


def encode_response(op_name: str, result: dict[str, Any], request_id: str = "ec2front") -> bytes:
    """The XML document EC2 answers ``op_name`` with, carrying ``result`` (output shape keys)."""
    shape = operation(op_name).output_shape
    body = _encode(shape, result, op_name) if shape is not None else ""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{op_name}Response xmlns="{XMLNS}">'
            f"<requestId>{request_id}</requestId>{body}</{op_name}Response>").encode()


def error_document(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error></Errors><RequestID>ec2front</RequestID></Response>"
            ).encode()


def parse_response(op_name: str, body: bytes, status: int = 200) -> dict[str, Any]:
    """What botocore's own EC2 parser reads from ``body`` (the tests' check of the documents)."""
    import botocore.parsers

    model = operation(op_name)
    parser = botocore.parsers.create_parser("ec2")
    return parser.parse({"body": body, "headers": {}, "status_code": status}, model.output_shape)

"""Reading an ONNX model (file -> `OnnxModel`): the protobuf and its external data, model-local
functions inlined, the default domain's opset, the graph's inputs (initializers left out, as
older exporters list them among the inputs), outputs, initializers and nodes."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, inliner, numpy_helper

from dslc import fsutil

MIN_OPSET = 13  # the oldest opset imported (Softmax, Split, Squeeze took their present form)
MAX_FILE = 2 << 30  # bytes: protobuf's own limit for one message
DEFAULT_DOMAINS = ("", "ai.onnx")
# ONNX element types the language has, by their TensorProto number.
DTYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "f32", onnx.TensorProto.FLOAT16: "f16",
    onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.FLOAT8E4M3FN: "f8e4m3",
    onnx.TensorProto.FLOAT8E5M2: "f8e5m2", onnx.TensorProto.INT8: "i8",
    onnx.TensorProto.UINT8: "u8", onnx.TensorProto.INT32: "i32",
    onnx.TensorProto.INT64: "i64", onnx.TensorProto.BOOL: "bool",
}


class OnnxReadError(Exception):
    """The file is no ONNX model that can be read (a usage or I/O error, not the model's)."""


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: its name, ONNX element type and sizes (an int, a symbolic
    name, or None where the file says nothing)."""

    name: str
    elem_type: int
    dims: tuple[int | str | None, ...] | None  # None: the rank is unknown

    @property
    def type_name(self) -> str:
        return onnx.TensorProto.DataType.Name(self.elem_type).lower()


@dataclass
class OnnxModel:
    source: str  # the file as diagnostics name it
    graph: onnx.GraphProto
    opset: int | None  # the default domain's version (None: not imported)
    domains: dict[str, int]  # every opset the model imports
    initializers: dict[str, np.ndarray]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]


def read(path: Path, source: str) -> OnnxModel:
    """The model in `path` (named `source` in diagnostics)."""
    try:
        data = fsutil.read_limited(path, MAX_FILE)
    except OSError as err:
        raise OnnxReadError(f"cannot read `{source}`: {_reason(err)}") from err
    try:
        model = onnx.load_model_from_string(data)
    except Exception as err:  # protobuf's DecodeError and friends: not an ONNX file
        raise OnnxReadError(f"`{source}` is not an ONNX model ({type(err).__name__})") from err
    if not model.HasField("graph"):
        raise OnnxReadError(f"`{source}` is not an ONNX model (it holds no graph)")
    try:
        external_data_helper.load_external_data_for_model(model, str(path.resolve().parent))
    except Exception as err:  # a missing or unreadable `.data` file beside the model
        raise OnnxReadError(f"cannot read the external data of `{source}`: {err}") from err
    try:
        model = inliner.inline_local_functions(model)
    except Exception as err:
        raise OnnxReadError(f"cannot inline the functions of `{source}`: {err}") from err
    domains = {o.domain: o.version for o in model.opset_import}
    opset = next((domains[d] for d in DEFAULT_DOMAINS if d in domains), None)
    graph = model.graph
    initializers = {}
    for t in graph.initializer:
        try:
            initializers[t.name] = numpy_helper.to_array(t)
        except Exception as err:
            raise OnnxReadError(f"cannot read the initializer `{t.name}` of `{source}`: "
                                f"{err}") from err
    inputs = [_info(v) for v in graph.input if v.name not in initializers]
    return OnnxModel(source, graph, opset, domains, initializers, inputs,
                     [_info(v) for v in graph.output])


def _info(v: onnx.ValueInfoProto) -> TensorInfo:
    t = v.type.tensor_type
    if not t.HasField("shape"):
        return TensorInfo(v.name, t.elem_type, None)
    dims: list[int | str | None] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorInfo(v.name, t.elem_type, tuple(dims))


def scope_of(node: onnx.NodeProto) -> str | None:
    """The PyTorch module a node was exported from (`layer1.0.conv1`), or None: the
    torch.export-based exporter records the module paths in `pkg.torch.onnx.name_scopes` (the
    last entry is the op itself), the TorchScript exporter in the node's name
    (`/layer1/layer1.0/conv1/Conv`, a child of a container spelled with its parent's prefix)."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            names = [s for s in scopes[:-1] if isinstance(s, str) and s]
            return names[-1] if names else None
    if node.name.startswith("/"):
        parts: list[str] = []
        for segment in node.name.split("/")[1:-1]:
            if parts and segment.startswith(parts[-1] + "."):
                parts[-1] = segment
            elif segment:
                parts.append(segment)
        return ".".join(parts) or None
    return None


def _reason(err: OSError) -> str:
    reason = err.strerror or str(err) or type(err).__name__
    return reason[:1].lower() + reason[1:]

"""The generated runner module: a class named after the model, a typed `__call__` with the
model's inputs, a docstring of shapes and dtypes, and the schedule spelled out.

Every name that reaches the generated code is sanitised: string content goes through `repr`,
docstrings and comments are escaped, identifiers are made legal and kept off keywords and
builtins. Nothing written in a `.cgraph` file can change what the runner does.
"""

from __future__ import annotations

import builtins
import keyword
import re
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from dslc import __version__
from dslc.compile.stage import Compiled
from dslc.core.types import format_type
from dslc.runtime.manifest import written_inputs

RESERVED = set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | {"self", "Model",
                                                                                 "Path", "Any"}


def identifier(text: str, suffix: str = "") -> str:
    """A legal, unreserved Python identifier made from `text`."""
    out = re.sub(r"\W", "_", text, flags=re.ASCII)
    if not out or out[0].isdigit():
        out = "_" + out
    if out in RESERVED or out.startswith("__"):
        out = out + "_"
    return out + suffix


def class_name(model: str) -> str:
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", model) if p]
    name = "".join(p[:1].upper() + p[1:] for p in parts) or "Model"
    return identifier(name, "Runner")


def doc(text: Any) -> str:
    """Safe inside a triple-quoted docstring: no backslashes, no quotes that end it."""
    s = str(text).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return "".join(ch if ch.isprintable() or ch == " " else "?" for ch in s)


def comment(text: Any) -> str:
    """Safe on one comment line."""
    return "".join(ch if ch.isprintable() else " " for ch in str(text))


def render(compiled: Compiled, bundle_name: str, module: str) -> str:
    env = Environment(loader=PackageLoader("dslc.emit", "templates"), undefined=StrictUndefined,
                      keep_trailing_newline=True, autoescape=False)
    env.filters.update(py=repr, doc=doc, comment=comment)
    model = compiled.model
    params: set[str] = set()
    inputs = []
    for i in model.inputs:
        param = identifier(i.name)
        while param in params:
            param += "_"
        params.add(param)
        inputs.append({"name": i.name, "param": param, "type": format_type(i.type)})
    outputs = [{"name": o.name, "type": format_type(o.type)} for o in model.outputs]
    dims = [f"{d.name}: {d.lo}..{d.hi}" + (f" align {d.align}" if d.align > 1 else "")
            for d in model.dynamic_dims]
    dims += [f"buckets: {', '.join(', '.join(f'{k}={v}' for k, v in b.items()) for b in model.buckets)}"] \
        if model.dynamic_dims else []
    nodes = compiled.graph.by_name()
    steps = []
    for s in compiled.steps:
        ops = " -> ".join(nodes[n].op for n in s.group.nodes)
        where = "cuDNN graph" if s.kind == "graph" else "fallback kernel (CuPy)"
        steps.append({"where": f"{s.group.name}: {ops} [{where}]"})
    written = written_inputs(compiled.graph)
    caches = {w.input for w in written}
    decoding = {"caches": ", ".join(f"`{w.input}`" for w in written),
                "position": next((w.at for w in written if w.at is not None), None),
                "example": ", ".join(f"{i['name']!r}: ..." for i in inputs
                                     if i["name"] not in caches and
                                     i["name"] not in {w.at for w in written})}
    text = env.get_template("runner.py.j2").render(
        decoding=decoding if written else None,
        model=model.name, version=__version__, source=model.file, module=identifier(module),
        cls=class_name(model.name), inputs=inputs, outputs=outputs, dims=dims,
        bundle_name=bundle_name, weights_name=bundle_name.rsplit(".", 1)[0] + ".safetensors",
        steps=steps,
        graph_steps=sum(1 for s in compiled.steps if s.kind == "graph"),
        kernel_steps=sum(1 for s in compiled.steps if s.kind == "kernel"),
        call_example=", ".join(f"{i['param']}=..." for i in inputs))
    return text


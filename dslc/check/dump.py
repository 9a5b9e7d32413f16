"""The checked model as text (`dslc compile --dump types`): the manifest, then every op with its
type, instance path and source line."""

from __future__ import annotations

from dslc.check.checker import CheckedModel
from dslc.core.dims import format_dim
from dslc.core.types import format_type
from dslc.ir.printer import format_graph


def format_checked(model: CheckedModel) -> str:
    lines = [f"model {model.name}  # {model.file}", f"precision {model.precision}"]
    for d in model.dims:
        if d.dynamic:
            tune = f" tune {list(d.tune)}" if d.tune else ""
            lines.append(f"dim {d.name} = {d.lo}..{d.hi} align {d.align}{tune}")
        else:
            lines.append(f"dim {d.name} = {format_dim(d.value)}")
    lines.append("buckets " + ", ".join("(" + ", ".join(f"{k}={v}" for k, v in b.items()) + ")"
                                        for b in model.buckets))
    lines += [f"input {i.name}: {format_type(i.type)}" for i in model.inputs]
    lines += [f"output {o.name}: {format_type(o.type)}" for o in model.outputs]
    lines += [f"param {p.path}: {p.dtype}{list(p.shape)}" for p in model.params]
    lines.append("")
    return "\n".join(lines) + "\n" + format_graph(model.graph, with_source=True)

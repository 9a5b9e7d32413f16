"""The imported graph in the terms a person would write it in (`recognise`): the standard
library's layers (`patterns`), attention (`attention`) and GELU (`activations`) in place of the
operations the exporter spelled them with."""

from __future__ import annotations

from dslc.core.dims import DimEnv
from dslc.importer import activations, attention, patterns
from dslc.importer.graph import Op


def recognise(outputs: list[tuple[str, Op]], env: DimEnv) -> list[tuple[str, Op]]:
    rules = [attention.sdpa, activations.gelu, *patterns.RULES]
    r = patterns.Recogniser([op for _, op in outputs], rules, env)
    r.run()
    return [(name, r.final(op)) for name, op in outputs]

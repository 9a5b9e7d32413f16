"""The imported graph in the terms a person would write it in (`recognise`): the standard
library's layers (`patterns`) and attention (`attention`) in place of the operations the
exporter spelled them with."""

from __future__ import annotations

from dslc.core.dims import DimEnv
from dslc.importer import attention, patterns
from dslc.importer.graph import Op


def recognise(outputs: list[tuple[str, Op]], env: DimEnv) -> list[tuple[str, Op]]:
    r = patterns.Recogniser([op for _, op in outputs], [attention.sdpa, *patterns.RULES], env)
    r.run()
    return [(name, r.final(op)) for name, op in outputs]

"""What a generated runner imports: checking inputs against the manifest, bundle loading, plan
restore (or replay, or heuristics), the memory plan, execution and CUDA graphs. Needs no GPU to
import; running does (R0801 otherwise). Never imports the front end (lark) or jinja2."""

from dslc.core.errors import RunnerError
from dslc.runtime.model import Captured, Model

__all__ = ["Captured", "Model", "RunnerError"]

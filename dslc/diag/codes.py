"""The registry of diagnostic codes: one line per code, its severity and title.

Families: E01 syntax, E02 names and calls, E03 shapes, E04 dtypes, E05 layouts, E06 dims and
buckets, E07 defs and imports, E08 backend support, E09 models imported from ONNX (`dslc import`),
W warnings, R runner errors at run time.
The long explanation of each code (`dslc explain CODE`) is `explanations/CODE.md` beside this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Literal, get_args

# Every registered code, as a type: a code written where a `CodeId` is expected (a diagnostic,
# a runner error, a type rule's error) is checked by mypy against this list, so a typo or an
# unregistered code fails the type check, not a user. `_TABLE` below gives each its title.
CodeId = Literal[
    "E0101", "E0102", "E0103", "E0104", "E0105", "E0106", "E0201", "E0202", "E0203",
    "E0204", "E0205", "E0206", "E0207", "E0208", "E0209", "E0210", "E0211",
    "E0301", "E0302",
    "E0303", "E0304", "E0305", "E0306", "E0401", "E0402", "E0403", "E0404", "E0501", "E0502",
    "E0503", "E0601", "E0602", "E0603", "E0604", "E0605", "E0606", "E0607", "E0701",
    "E0702", "E0703", "E0704", "E0705", "E0801", "E0802", "E0901", "E0902", "W0201", "W0202",
    "W0203", "W0301", "W0302", "W0303", "W0401", "W0501", "W0602", "R0201", "R0202", "R0203",
    "R0301", "R0401", "R0501", "R0601", "R0602", "R0801", "R0802", "R0803",
]


@dataclass(frozen=True, slots=True)
class Code:
    code: CodeId
    title: str

    @property
    def severity(self) -> str:
        return "warning" if self.code.startswith("W") else "error"


_TABLE = """
E0101 syntax error
E0102 a declaration is written with `=` where a type is expected
E0103 a statement is not allowed in this kind of block
E0104 arguments in the wrong order, or a keyword given twice
E0105 unsupported language version
E0106 a literal or name beyond the language's limits
E0201 cannot find a value in this scope
E0202 a name is defined twice
E0203 unknown operation
E0204 wrong arguments to a call
E0205 two unnamed instances in one `let`
E0206 an unqualified import clashes with another name
E0207 a value is used where its `when` condition is false
E0208 invalid instance path, or a parameter path declared twice
E0209 a value of the wrong kind
E0210 wrong number of names in a tuple binding
E0211 a write in place into something other than a model input nothing else reads
E0301 incompatible shapes
E0302 the inner dimensions of `matmul` differ
E0303 a `repeat` body changes the type it passes on
E0304 invalid axis or permutation
E0305 invalid attribute value
E0306 a tensor rank or size beyond what cuDNN can index
E0401 unsupported dtype for this operation
E0402 implicit mix of integer and float values
E0403 compute precision narrower than the operation needs
E0404 fp8 asked of an operation that cannot compute in it as written
E0501 a layout tag that does not fit the tensor
E0502 an operation's layout requirement is not met
E0503 a reshape that is not a view
E0601 a tune bucket outside its dim's range
E0602 a division that is not exact for every admissible value
E0603 an output size below 1
E0604 a compile-time condition that depends on a dynamic dim
E0605 a parameter shape that depends on a dynamic dim
E0606 an invalid `dim` or `buckets` declaration, or a dynamic dim no input sizes
E0607 a slice out of bounds
E0701 a def that calls itself
E0702 an import cycle
E0703 import not found
E0704 a def or model that is incomplete or repeated
E0705 a model nested or expanded beyond the compiler's limits
E0801 no cuDNN engine supports a fused group
E0802 an operation the target device cannot run
E0901 an ONNX node that cannot be imported
E0902 an ONNX model that cannot be imported as a whole
W0201 a value that is never used
W0202 weights holding NaN or infinite values
W0203 weights the model does not declare
W0301 a rank-1 operand broadcast onto the width axis
W0302 an attention head dimension above 128
W0303 an f32 attention, run as a fallback kernel on the GPU
W0401 narrowing to fp8 without a scale
W0501 a reduced-precision convolution on NCHW data
W0602 many buckets
R0201 missing or unexpected input
R0202 weights missing or not matching the model
R0203 fp8 scales missing, or calibrated with other weights
R0301 an input of the wrong shape
R0401 an input of the wrong dtype
R0501 an input of the wrong layout or device
R0601 a dynamic dim outside its declared range
R0602 a dynamic dim not a multiple of its alignment
R0801 no usable GPU or cuDNN
R0802 a saved plan could not be used
R0803 a model that cannot be captured as a CUDA graph
"""

# Codes dslc no longer reports; they stay registered so `dslc explain` still answers for them.
# E0502, E0503: an op that needs another memory order, or a reshape that is no view, reads a
# row-major copy of its input (as numpy and PyTorch do) instead of failing the build.
RETIRED: frozenset[CodeId] = frozenset({"E0502", "E0503"})

_TITLES = dict(line.split(" ", 1) for line in _TABLE.strip().splitlines())
CODES: dict[str, Code] = {code: Code(code, _TITLES[code]) for code in get_args(CodeId)}


def lookup(code: str) -> Code | None:
    return CODES.get(code.strip().upper())


def explanation(code: str) -> str | None:
    """The long explanation of `code`, or None when the code is unknown."""
    entry = lookup(code)
    if entry is None:
        return None
    path = resources.files("dslc.diag").joinpath("explanations", f"{entry.code}.md")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None

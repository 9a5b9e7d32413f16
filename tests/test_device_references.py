"""The op references run on the device as they run on the host: the fallback kernels and the
tuner call them with CuPy arrays, and each must build its temporaries with the array's own
module (`reference_conv.array_module`, `pointwise.special_functions`), or the GPU sees a host
array meet a device array (CuPy refuses: TypeError) or a host result where a device one was due.

CI has no GPU, so `cupy` here is a stand-in (why a fake: these tests are about which module a
reference asks, not CuPy's numbers, which the GPU suite checks): NumPy's values behind a type
that behaves as CuPy's arrays do towards NumPy. NumPy's functions and ufuncs (SciPy's special
ufuncs too) called on device arrays dispatch to the device module (CuPy's `__array_function__`
and `__array_ufunc__`), a host array among their operands is refused, and a device array is
never converted to a host one implicitly (`__array__` raises, as CuPy's does). Each test runs a
reference on device arrays and checks that the result is a device array holding the values the
same reference computes on the host (the values themselves are checked against PyTorch in
`test_op_references.py`)."""

from __future__ import annotations

import operator
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import scipy.special

from dslc.ops import attention, index, pointwise, reference_conv
from tests.helpers import rng


class DeviceArray:
    """A CuPy array's stand-in: `type(a).__module__` starts with "cupy", as the references test."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed (a device array)")

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _wrap(getattr(ufunc, method)(*_host(inputs), **_host(kwargs)))

    def __array_function__(self, func: Callable[..., Any], types: Any, args: Any,
                           kwargs: Any) -> Any:
        return _wrap(func(*_host(args), **_host(kwargs)))

    def __getitem__(self, key: Any) -> Any:
        return _wrap(self.values[_host(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        self.values[_host(key)] = _host(value)

    def __getattr__(self, name: str) -> Any:  # shape, dtype, strides, reshape, astype, ...
        if name.startswith("__"):  # no __array_interface__: NumPy would read the values
            raise AttributeError(name)
        found = getattr(self.values, name)
        if callable(found):
            return lambda *a, **k: _wrap(found(*_host(a), **_host(k)))
        return _wrap(found)

    def __len__(self) -> int:
        return len(self.values)

    def __neg__(self) -> Any:
        return np.negative(self)


DeviceArray.__module__ = "cupy._core.standin"
Device = Callable[[np.ndarray], Any]  # a host array -> the same values on the device (typed
# Any: the references are typed for NumPy's arrays and take CuPy's alike)


def _operator(fn: Callable[[Any, Any], Any], reflected: bool) -> Callable[[Any, Any], Any]:
    def method(self: DeviceArray, other: Any) -> Any:
        ufunc = {operator.add: np.add, operator.sub: np.subtract, operator.mul: np.multiply,
                 operator.truediv: np.true_divide, operator.floordiv: np.floor_divide,
                 operator.pow: np.power, operator.lt: np.less, operator.le: np.less_equal,
                 operator.gt: np.greater, operator.ge: np.greater_equal,
                 operator.and_: np.logical_and, operator.or_: np.logical_or,
                 operator.eq: np.equal, operator.ne: np.not_equal}[fn]
        return ufunc(other, self) if reflected else ufunc(self, other)
    return method


for _name, _fn in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", operator.truediv), ("floordiv", operator.floordiv),
                   ("pow", operator.pow), ("and", operator.and_), ("or", operator.or_)]:
    setattr(DeviceArray, f"__{_name}__", _operator(_fn, False))
    setattr(DeviceArray, f"__r{_name}__", _operator(_fn, True))
for _name, _fn in [("lt", operator.lt), ("le", operator.le), ("gt", operator.gt),
                   ("ge", operator.ge), ("eq", operator.eq), ("ne", operator.ne)]:
    setattr(DeviceArray, f"__{_name}__", _operator(_fn, False))


def _host(x: Any) -> Any:
    """Device arrays' values, for NumPy to compute on; a host array is refused, as CuPy's
    kernels refuse NumPy arrays among their operands."""
    if isinstance(x, DeviceArray):
        return x.values
    if isinstance(x, np.ndarray):
        raise TypeError(f"Unsupported type {type(x)}: a host array among device operands")
    if isinstance(x, tuple | list):
        return type(x)(_host(v) for v in x)
    if isinstance(x, dict):
        return {k: _host(v) for k, v in x.items()}
    return x


def _wrap(x: Any) -> Any:
    """NumPy's results as device arrays (what CuPy returns)."""
    if isinstance(x, np.ndarray):
        return DeviceArray(x)
    if isinstance(x, tuple | list):
        return type(x)(_wrap(v) for v in x)
    return x


def _module(name: str, host: Any) -> types.ModuleType:
    """A device module: `host`'s functions taking and returning device arrays; its types and
    constants as they are; `lib` and `lib.stride_tricks` alike."""
    module = types.ModuleType(name)

    def attribute(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        found = getattr(host, attr)
        if isinstance(found, types.ModuleType):
            return _module(f"{name}.{attr}", found)
        if callable(found) and not isinstance(found, type):
            return lambda *a, **k: _wrap(found(*_host(a), **_host(k)))
        return found
    module.__getattr__ = attribute  # type: ignore[method-assign]
    module.ndarray = DeviceArray  # type: ignore[attr-defined]
    return module


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Iterator[Device]:
    """`cupy` and `cupyx.scipy.special` as device modules for the test; yields the function
    that puts a host array on the device."""
    special = _module("cupyx.scipy.special", scipy.special)
    scipy_module = types.ModuleType("cupyx.scipy")
    scipy_module.special = special  # type: ignore[attr-defined]
    cupyx = types.ModuleType("cupyx")
    cupyx.scipy = scipy_module  # type: ignore[attr-defined]
    for name, module in [("cupy", _module("cupy", np)), ("cupyx", cupyx),
                         ("cupyx.scipy", scipy_module), ("cupyx.scipy.special", special)]:
        monkeypatch.setitem(sys.modules, name, module)
    yield lambda a: DeviceArray(a.copy())


def _same(result: Any, expected: np.ndarray) -> None:
    """A device array holding the host's values."""
    assert isinstance(result, DeviceArray), f"a host result ({type(result).__name__})"
    np.testing.assert_array_equal(result.values, expected)


def test_the_stand_in_refuses_a_host_array_among_device_ones(
        device: Device) -> None:
    x = device(np.ones(3, np.float32))
    with pytest.raises(TypeError):
        np.ones(3, np.float32) + x
    with pytest.raises(TypeError):
        np.asarray(x)
    _same(np.pad(x, [(1, 1)]), np.pad(np.ones(3, np.float32), [(1, 1)]))


def test_the_array_module_of_a_device_array_is_the_device_module(
        device: Device) -> None:
    assert reference_conv.array_module(device(np.ones(2))) is sys.modules["cupy"]
    assert reference_conv.array_module(np.ones(2)) is np
    assert pointwise.special_functions(device(np.ones(2))) is sys.modules["cupyx.scipy.special"]
    assert pointwise.special_functions(np.ones(2)) is scipy.special


def test_a_convolution_stays_on_the_device(device: Device) -> None:
    r = rng()
    x, w = r.standard_normal((2, 4, 7, 6), np.float32), r.standard_normal((6, 2, 3, 2), np.float32)
    args = ([2, 1], [1, 0], [1, 1], [1, 2], 2)  # stride, padding before and after, dilation, groups
    _same(reference_conv.conv(device(x), device(w), *args), reference_conv.conv(x, w, *args))


def test_a_transposed_convolution_stays_on_the_device(
        device: Device) -> None:
    r = rng()
    x, w = r.standard_normal((1, 3, 4, 5), np.float32), r.standard_normal((3, 2, 3, 3), np.float32)
    args = ([2, 2], [1, 0], [1, 1], [1, 0])  # stride, padding, dilation, output padding
    _same(reference_conv.conv_transpose(device(x), device(w), *args),
          reference_conv.conv_transpose(x, w, *args))


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_a_pooling_counting_its_window_without_the_padding_stays_on_the_device(
        mode: str, device: Device) -> None:
    x = rng().standard_normal((2, 3, 5, 6), np.float32)
    a = {"window": (3, 2), "stride": (2, 2), "pad": (1, 1), "count_pad": False}
    _same(reference_conv.pool(device(x), a, mode), reference_conv.pool(x, a, mode))


def test_a_bilinear_upsampling_stays_on_the_device(
        device: Device) -> None:
    x = rng().standard_normal((1, 2, 3, 4), np.float32)
    a = {"factor": (2, 3), "mode": "bilinear"}
    _same(reference_conv.upsample(device(x), a), reference_conv.upsample(x, a))


def test_a_gather_stays_on_the_device(device: Device) -> None:
    x = rng().standard_normal((5, 3), np.float32)
    idx = np.array([[0, 4], [7, -1]], np.int32)  # two outside: NaN
    a = {"axis": 0}
    _same(index._gather_ref([device(x), device(idx)], a), index._gather_ref([x, idx], a))


@pytest.mark.parametrize("lengths", [False, True])
def test_an_attention_stays_on_the_device(lengths: bool,
                                          device: Device) -> None:
    r = rng()
    q = r.standard_normal((2, 4, 3, 8), np.float32)
    k, v = (r.standard_normal((2, 2, 5, 8), np.float32) for _ in range(2))
    host = [q, k, v]
    a: dict[str, Any] = {"scale": None, "causal": True, "window": None, "align": "bottom_right"}
    if lengths:
        host.append(np.array([5, 4], np.int32))
        a["operands"] = ("q", "k", "v", "kv_len")
    _same(attention._sdpa_ref([device(h) for h in host], a), attention._sdpa_ref(host, a))


@pytest.mark.parametrize("fn", [pointwise._sigmoid, pointwise._erf])
def test_the_special_functions_stay_on_the_device(
        fn: Callable[[Any], Any], device: Device) -> None:
    x = rng().standard_normal((3, 4), np.float32)
    _same(fn(device(x)), fn(x))

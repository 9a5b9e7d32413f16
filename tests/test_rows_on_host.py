"""The row copy's kernel (`backend.rows`) run on the CPU: its CUDA source compiled as C++ by the
host compiler, with every (block, thread) of a small grid called in turn. The kernel is a
grid-stride loop with no shared memory, barrier or warp operation, so a sequential run makes the
same writes as the GPU's. Numbers are checked against numpy's assignment of the same parts into
their slices (the independent side), for a concat's parts in one launch and a part alone; the
GPU run is `tests/gpu/test_rows_gpu.py`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dslc.backend import rows
from tests.test_fused_kernel import _GRID, _SHIMS  # CUDA's names for g++, uint2 and uint4 too

COMPILER = shutil.which("g++")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no host C++ compiler (.ci/run installs g++)")

# main(): reads the parts' widths and places (in words), the row count and the pitch from argv,
# the parts' bits from stdin, and writes the destination rows (prefilled with 0xAB bytes) to stdout
MAIN = """
#include <vector>
#include <cstdlib>
int main(int argc, char** argv) {
  const int n = atoi(argv[1]), rows = atoi(argv[2]), pitch = atoi(argv[3]);
  std::vector<int> width(4, 0), at(4, 0);
  for (int k = 0; k < n; ++k) { width[k] = atoi(argv[4 + 2 * k]); at[k] = atoi(argv[5 + 2 * k]); }
  std::vector<std::vector<WORD>> x(4);
  for (int k = 0; k < n; ++k) {
    x[k].resize((size_t)rows * width[k]);
    fread(x[k].data(), sizeof(WORD), x[k].size(), stdin);
  }
  std::vector<WORD> y((size_t)rows * pitch);
  memset(y.data(), 0xAB, y.size() * sizeof(WORD));
  const WORD* xs[4] = {0, 0, 0, 0};
  WORD* ys[4] = {0, 0, 0, 0};
  long long per_row = 0;
  for (int k = 0; k < n; ++k) { xs[k] = x[k].data(); ys[k] = y.data() + at[k]; per_row += width[k]; }
  blockDim.x = 32; gridDim.x = 3;  // fewer threads than words: the grid-stride loop goes round
  for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x)
    for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x)
      dslc_copy_rows(xs[0], xs[1], xs[2], xs[3], ys[0], ys[1], ys[2], ys[3],
                     width[0], width[1], width[2], width[3], width[0], width[1], width[2],
                     width[3], pitch, pitch, pitch, pitch, (long long)rows * per_row, per_row);
  fwrite(y.data(), sizeof(WORD), y.size(), stdout);
  return 0;
}
"""


def _built(tmp_path: Path, word: str) -> Path:
    src = tmp_path / "rows.cpp"
    src.write_text(_SHIMS + _GRID + "#include <cstdio>\n" + rows.source(word)
                   + MAIN.replace("WORD", word))
    exe = tmp_path / "rows"
    assert COMPILER is not None
    subprocess.run([COMPILER, "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    return exe


@pytest.mark.parametrize(("size", "word"), sorted(rows._WORDS.items()))
@pytest.mark.parametrize("widths", [(32, 32), (3, 5, 1, 2), (7,)])
def test_the_row_copy_kernel_writes_each_part_into_its_slice_and_nothing_else(
        tmp_path: Path, size: int, word: str, widths: tuple[int, ...]) -> None:
    """Widths and pitches in words of `size` bytes; the data as bytes."""
    rows_, pitch = 37, sum(widths) + 3  # three words past the parts, untouched
    g = np.random.default_rng(len(widths) * 31 + size)
    parts = [g.integers(0, 256, (rows_, w * size), dtype=np.uint8) for w in widths]
    want = np.full((rows_, pitch * size), 0xAB, np.uint8)
    args, at = [str(len(widths)), str(rows_), str(pitch)], 0
    for part, w in zip(parts, widths, strict=True):
        want[:, at * size:(at + w) * size] = part
        args += [str(w), str(at)]
        at += w
    exe = _built(tmp_path, word)
    out = subprocess.run([str(exe), *args], input=b"".join(p.tobytes() for p in parts),
                         capture_output=True, check=True).stdout
    np.testing.assert_array_equal(np.frombuffer(out, np.uint8).reshape(rows_, pitch * size), want)


def test_a_wrong_index_in_the_kernel_is_seen(tmp_path: Path) -> None:
    """The check can fail: the kernel reading the source at the destination's pitch."""
    good = rows.source("unsigned short")
    bad = good.replace("x##k[r * xp##k + c]", "x##k[r * yp##k + c]")
    assert bad != good
    src = tmp_path / "rows.cpp"
    src.write_text(_SHIMS + _GRID + "#include <cstdio>\n" + bad
                   + MAIN.replace("WORD", "unsigned short"))
    assert COMPILER is not None
    subprocess.run([COMPILER, "-O1", "-o", str(tmp_path / "rows"), str(src)], check=True,
                   capture_output=True)
    parts = [np.arange(10 * 4, dtype=np.uint16).reshape(10, 4),
             np.arange(10 * 4, dtype=np.uint16).reshape(10, 4) + 100]
    out = subprocess.run([str(tmp_path / "rows"), "2", "10", "9", "4", "0", "4", "4"],
                         input=b"".join(p.tobytes() for p in parts), capture_output=True).stdout
    got = np.frombuffer(out, np.uint16).reshape(10, 9) if len(out) == 180 else None
    assert got is None or not np.array_equal(got[:, :4], parts[0])

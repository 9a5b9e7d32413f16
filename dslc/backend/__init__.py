"""The floor that talks to cuDNN and CuPy, below compile, tune and runtime: group specs
(`spec`), cuDNN graphs and plans (`graphs`), device profiles (`target`), the device and its
environment (`device`, `environment`), measuring plans (`measure`) and the CuPy kernels of ops
that run outside cuDNN (`kernels`). Only this package imports cudnn and cupy (the references'
CuPy convolution in `dslc.ops.reference_conv` aside), and only when used, so it imports on a
machine without either."""

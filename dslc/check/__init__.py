"""The checker: names, dims, shapes, dtypes and layouts (`checker.check` is the entry point).

Kept free of imports so that `dslc.ops` can use `dslc.core.dims` and `dslc.core.types`.
"""

"""The shared vocabulary at the bottom floor: dtypes, tensor types and layouts (`types`) and
symbolic dims (`dims`). Every package may import it; it imports only `dslc.diag`."""

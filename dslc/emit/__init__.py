"""Emission: what a compiled model leaves on disk (the bundle, the runner, the manifest)."""

"""Compile: fused groups -> cuDNN graphs and plans (`stage.compile_model`), through
`dslc.backend` (the only package that imports cudnn)."""

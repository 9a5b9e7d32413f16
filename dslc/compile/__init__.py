"""Compile: fused groups -> cuDNN graphs and plans (`stage.compile_model`). Only
`dslc.compile.graphs` and `dslc.compile.target` import cudnn, and only when used."""

"""Compile: fused groups -> cuDNN graphs and plans (`stage.compile_model`). Only
`dslc.backend.graphs` and `dslc.backend.target` import cudnn, and only when used."""

"""`dslc bench`: a compiled model timed on the GPU (plain calls, CUDA-graph replay), against
PyTorch on the same weights, with a per-step roofline. Above the pipeline (a `.cgraph` file is
compiled first), below the command line, which renders what `measure.bench` reports."""

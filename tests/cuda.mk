# filled by the CUDA backend author

"""The engines of the exact kNN (``evaluation/knn.py``), in a module without torch so that the config and the
command line can name them without importing torch."""

KNN_ENGINES = ("auto", "torch", "numpy", "faiss", "cuda")
"""``eval.engine``: torch, numpy (torch with numpy's BLAS products), faiss, cuda (torch on the GPU), or auto."""

"""Retrieval: build a faiss index of a gallery with a trained run (``build``, ``store``), query it
(``search``), and serve it over HTTP (``service``, ``uploads``, ``page.html``)."""

from .build import IndexResult, index_images
from .search import Hit, IndexSearcher, Searcher

__all__ = ["Hit", "IndexResult", "IndexSearcher", "Searcher", "index_images"]

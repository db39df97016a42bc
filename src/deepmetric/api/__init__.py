"""The Python API for trained runs: load a run, embed images exactly as ``deepmetric embed`` does, and build, extend,
save, open and search the retrieval indexes ``deepmetric index`` writes.

```python
import deepmetric

run = deepmetric.load_run("runs/cub")            # checkpoint "auto": best when it exists, else last (as the CLI)
x = run.embed(["a.jpg", "b.png"])                # (2, D) float32, l2-normalised: what `deepmetric embed` writes
index = deepmetric.Index.build(run, "gallery/", "gallery-index")   # the folder `deepmetric index` writes
for hit in index.search("query.jpg", k=5)[0]:    # one list of hits per query, best first
    print(hit.id, hit.name, hit.score)
```

Nothing here embeds, stores or searches on its own: images go through the library's reader (``read_image``,
``to_rgb``), the run's ``TestTransform`` and ``embed_table``, as ``deepmetric embed`` and ``deepmetric index`` do;
an index is written and read by ``retrieval.store`` and searched by ``retrieval.search.IndexSearcher``.

The parts: ``run.py`` (``load_run``, ``TrainedRun``), ``index.py`` (``Index``), ``image_inputs.py`` (the images
and embeddings they take).
"""

from ..data.image_inputs import ImageInput
from ..retrieval.search import Hit
from ..runs.trained import TrainedRun, load_run
from .index import Index

__all__ = ["Hit", "ImageInput", "Index", "TrainedRun", "load_run"]

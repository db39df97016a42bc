"""The run format, below training: what ``deepmetric train`` writes and every other command reads.

- ``folder.py``: the run directory (``RunDir``): its files, its log, its config, which checkpoint to use;
- ``lock.py``: one process at a time in a run folder (``RunDir.claimed``, ``RunDir.holding``);
- ``checkpoint.py``: the checkpoint file (safetensors, JSON state, written atomically, never pickled);
- ``model.py``: the trained model a checkpoint's model spec describes, checked before it is built;
- ``table.py``: the data table a run's config names (``load_table``);
- ``trained.py``: ``load_run`` and ``TrainedRun``, a run's model with its test-time preprocessing.

Search, serve, export, explain and report read runs through this package alone: none of them imports
``deepmetric.training`` (an import-linter contract in ``make test``). Import the submodules: this ``__init__``
gathers nothing, so that ``RunDir`` is read without torch.
"""

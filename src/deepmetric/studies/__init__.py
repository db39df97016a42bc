"""Studies: a grid of runs (heads x losses x regularisers x seeds or class-disjoint splits) on one budget,
resumable, aggregated into mean ± std tables and a chart."""

from .aggregate import write_results
from .collect import aggregate  # after .aggregate: the package's `aggregate` is this function
from .runner import run_study, write_tables_now
from .spec import StudySpec, load_study

__all__ = ["StudySpec", "aggregate", "load_study", "run_study", "write_results", "write_tables_now"]

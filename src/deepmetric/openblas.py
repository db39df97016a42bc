"""Stop OpenBLAS' idle threads from spinning between products (set before numpy loads OpenBLAS).

After each product OpenBLAS keeps its worker threads busy-waiting for the next one (by default for 2^28
cycles, about a tenth of a second). The kNN alternates a numpy product with torch's top-k, and on 2 cores the
spinning worker takes a core from torch's threads: the top-k of a block took 1.8 times as long
(docs/benchmarks/evaluation.md). ``OPENBLAS_THREAD_TIMEOUT=4`` (2^4 cycles, the least
OpenBLAS accepts) lets the workers sleep at once; it changes no result. A value the user set is kept, and the
setting has no effect when OpenBLAS was loaded before deepmetric was imported.
"""

import os

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

#!/usr/bin/env bash
# Mutation testing of the mathematical core with mutmut (a dev-only tool: pip install -e '.[dev]').
#
#   tools/mutation.sh [module ...]      # modules: high_order losses metrics knn kmeans mirage deml_oam jitter cache statistics heads
#                                       # (default: high_order losses metrics knn kmeans mirage heads)
#   nohup tools/mutation.sh losses > mutation-losses.log 2>&1 &     # the way to run it: it takes a while
#
# Each module is mutated in its own scratch copy of this working tree ($MUTATION_DIR/<module>, default
# .mutation/<module>, git-ignored) and only the test files that cover it run (mutmut then narrows each mutant to
# the tests that reach the mutated function). The scratch copy is kept, so a second run resumes where the first
# stopped and `cd .mutation/<module> && mutmut show <mutant>` shows a survivor. At the end each module's counts
# per file go to $MUTATION_DIR/<module>.json and are printed as the table of docs/testing.md
# (tools/mutation_table.py). Not part of `make test`: see docs/testing.md for the figures and the survivors.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}  # the venv of `make install-dev`
MUTMUT=${MUTMUT:-$(dirname "$PYTHON")/mutmut}
MUTATION_DIR=${MUTATION_DIR:-$ROOT/.mutation}
JOBS=${JOBS:-1}  # mutants tested at once (each is one pytest process of one thread)

# module -> (files to mutate, glob relative to the repository) and (the test files that cover it)
declare -A MUTATE TESTS
MUTATE[high_order]="src/deepmetric/models/high_order/*"
TESTS[high_order]="tests/test_horde.py tests/test_second_order.py"
MUTATE[losses]="src/deepmetric/losses/*"
TESTS[losses]="tests/test_losses.py tests/test_objective.py tests/test_horde.py tests/test_dgml.py tests/test_deml.py
               tests/test_attention_heads.py tests/test_head_contract.py tests/test_pml.py"
MUTATE[metrics]="src/deepmetric/evaluation/metrics.py"
TESTS[metrics]="tests/test_metrics.py tests/test_properties.py"
MUTATE[knn]="src/deepmetric/evaluation/knn.py src/deepmetric/evaluation/topk.py"
TESTS[knn]="tests/test_metrics.py tests/test_properties.py"
MUTATE[kmeans]="src/deepmetric/evaluation/kmeans.py"
TESTS[kmeans]="tests/test_kmeans.py"
MUTATE[mirage]="src/deepmetric/generators/mirage.py"
TESTS[mirage]="tests/test_mirage.py"
MUTATE[deml_oam]="src/deepmetric/models/heads/deml_oam.py"  # also in heads: alone, minutes instead of hours
TESTS[deml_oam]="tests/test_deml_oam.py tests/test_head_options.py"
MUTATE[jitter]="src/deepmetric/data/color_jitter.py src/deepmetric/data/jitter_options.py"
TESTS[jitter]="tests/test_color_jitter.py"
MUTATE[cache]="src/deepmetric/data/batched_transforms.py src/deepmetric/data/cache.py src/deepmetric/data/prefetch.py"
TESTS[cache]="tests/test_cache.py tests/test_prefetch.py tests/test_sampler_transforms.py tests/test_color_jitter.py"
MUTATE[statistics]="src/deepmetric/studies/statistics.py"
TESTS[statistics]="tests/test_statistics.py tests/test_studies.py"
MUTATE[heads]="src/deepmetric/models/heads/*"
TESTS[heads]="tests/test_head_contract.py tests/test_attention_heads.py tests/test_deml.py tests/test_deml_oam.py
              tests/test_dgml.py tests/test_jcf.py tests/test_second_order.py tests/test_horde.py tests/test_models.py
              tests/test_resume.py tests/test_head_options.py"

modules=("$@")
[ ${#modules[@]} -eq 0 ] && modules=(high_order losses metrics knn kmeans mirage heads)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for module in "${modules[@]}"; do
    [ -n "${MUTATE[$module]:-}" ] || { echo "unknown module '$module' (one of: ${!MUTATE[*]})" >&2; exit 2; }
    work=$MUTATION_DIR/$module
    mkdir -p "$work"
    # the working tree's sources, tests and presets (mutmut copies them again into $work/mutants)
    rm -rf "$work/src" "$work/tests" "$work/configs"
    cp -r "$ROOT/src" "$ROOT/tests" "$ROOT/configs" "$work/"  # some tests read the presets
    cp "$ROOT/pyproject.toml" "$work/"
    {
        echo "[mutmut]"
        echo "source_paths = src"
        echo "also_copy = configs"
        echo "only_mutate ="
        (set -f; for m in ${MUTATE[$module]}; do echo "    $m"; done)  # globs stay patterns
        echo "pytest_add_cli_args = -p no:cacheprovider -q -x"
        echo "pytest_add_cli_args_test_selection ="
        for t in ${TESTS[$module]}; do [ -f "$ROOT/$t" ] && echo "    $t"; done
    } > "$work/setup.cfg"
    echo "== $module: mutating ${MUTATE[$module]} against ${TESTS[$module]//$'\n'/ } ($(date -Is))"
    (cd "$work" && "$MUTMUT" run --max-children "$JOBS") || echo "mutmut run exited with $? for $module"
    (cd "$work" && "$PYTHON" "$ROOT/tools/mutation_table.py" --json "$MUTATION_DIR/$module.json" .)
    echo "== $module done ($(date -Is))"
done

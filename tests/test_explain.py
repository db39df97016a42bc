"""``deepmetric explain`` on runs trained through the real CLI path (tiny trunk), and the overlay helpers."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from deepmetric.cli import main
from deepmetric.errors import DeepMetricError
from deepmetric.models.heads import HEADS
from deepmetric.training import train
from deepmetric.training.run_dir import load_run_model
from deepmetric.viz import explain_images, upsample
from helpers import tiny_config

TINY = ["--data", "digits", "--backbone", "tiny", "--steps", "2", "--quiet", "--no-test", "model.pretrained=false",
        "model.embedding_dim=16", "data.image_size=16", "data.classes_per_batch=3", "data.samples_per_class=4",
        "train.lr=1e-3"]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    (folder / "sub").mkdir()
    for i, path in enumerate([folder / "a.png", folder / "b.jpg", folder / "sub" / "a.png"]):
        Image.new("RGB", (20 + 4 * i, 20), (40 * i, 200 - 40 * i, 90)).save(path)
    return folder


def png_sizes(folder):
    sizes = {}
    for path in sorted(folder.iterdir()):
        with Image.open(path) as image:
            image.verify()
            assert image.format == "PNG"
            sizes[path.name] = image.size
    return sizes


@pytest.mark.parametrize("head", ["dgml", "g-grouping"])
def test_explain_writes_overlays_per_image_and_top_images_per_group(head, tmp_path, image_folder, capsys):
    run_dir = tmp_path / "run"
    code, _, err = run(capsys, "train", *TINY, "--head", head, "--out", run_dir)
    assert code == 0, err
    out = tmp_path / "explain"
    code, printed, err = run(capsys, "explain", run_dir, "--images", image_folder, "--data", "--top", "5",
                             "--out", out, "--quiet")
    assert code == 0, err
    assert "wrote 3 attention overlays" in printed and "top 5 test images per group" in printed
    sizes = png_sizes(out)
    assert set(sizes) == {"a.png", "b.png", "sub__a.png", "top5-test.png"}
    width, height = sizes["a.png"]
    assert width > 3 * height  # the input and one panel per group (4), side by side
    grid_width, grid_height = sizes["top5-test.png"]
    assert grid_height > 2 * height and grid_width > width  # 4 rows (groups) of 5 images


def test_explain_on_a_head_without_attention_is_one_clear_error(tmp_path, image_folder, capsys):
    run_dir = tmp_path / "gap"
    assert run(capsys, "train", *TINY, "--head", "gap", "--out", run_dir)[0] == 0
    out = tmp_path / "explain"
    code, _, err = run(capsys, "explain", run_dir, "--images", image_folder, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: head 'gap' returns no attention maps") and not out.exists()
    code, _, err = run(capsys, "explain", run_dir, "--out", out)
    assert code == 2 and "needs --images PATH" in err


@pytest.mark.parametrize("head", sorted(HEADS))
def test_explain_serves_every_registered_head(head, tmp_path, image_folder):
    """Each head either has its maps drawn (whatever its number of maps) or gets the one error."""
    run_dir = tmp_path / "run"
    train(tiny_config(model={"head": head}, train={"steps": 1}), run_dir, progress=False)
    model, _, _ = load_run_model(run_dir)
    attention = model.eval()(torch.rand(1, 3, 16, 16)).attention
    if attention is None:
        with pytest.raises(DeepMetricError, match=f"head '{head}' returns no attention maps"):
            explain_images(run_dir, image_folder / "a.png", tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()
    else:
        written = explain_images(run_dir, image_folder / "a.png", tmp_path / "out", progress=False)
        assert [p.name for p in written] == ["a.png"] and png_sizes(tmp_path / "out")["a.png"][0] > 0


def test_upsample_is_bilinear_to_the_image_size():
    maps = torch.tensor([[[0.0, 1.0], [0.0, 1.0]], [[0.25, 0.25], [0.25, 0.25]]])
    up = upsample(maps, (8, 6))
    assert up.shape == (2, 8, 6)
    assert up[0].min() == 0.0 and up[0].max() == 1.0 and (up[0][:, 1:] >= up[0][:, :-1]).all()  # a ramp
    assert abs(up[1] - 0.25).max() < 1e-7  # a uniform map stays uniform

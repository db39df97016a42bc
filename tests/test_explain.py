"""``deepmetric explain`` on runs trained through the real CLI path (tiny trunk), and the overlay helpers."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from PIL import Image

from deepmetric.cli import main
from deepmetric.errors import DeepMetricError
from deepmetric.models.heads import HEADS
from deepmetric.runs.model import load_run_model
from deepmetric.training import train
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
    code, _, err = run(capsys, "explain", run_dir, "--images", image_folder, tmp_path / "typo.png", "--out", out)
    assert code == 2 and err == f"error: {tmp_path / 'typo.png'} does not exist\n" and not out.exists()  # first


def test_a_head_without_maps_is_refused_from_the_checkpoint_header_before_the_model_is_built(tmp_path, image_folder,
                                                                                             capsys, monkeypatch):
    """Issue 53 item 10: ``explain`` on a GAP run built and loaded the model (12 s) before saying it has no maps.
    The head's declaration (``Head.has_attention_maps``) is read from the checkpoint's header: no model is built."""
    import deepmetric.viz.explain as explain

    run_dir = tmp_path / "gap"
    train(tiny_config(train={"steps": 1}), run_dir, progress=False)
    built = []
    monkeypatch.setattr(explain, "load_run_model", lambda *args, **kwargs: built.append(args) or 1 / 0)
    for argv in (["--images", image_folder], ["--data"], ["--images", image_folder, "--data", "digits"]):
        code, out, err = run(capsys, "explain", run_dir, *argv, "--out", tmp_path / "out", "--quiet")
        assert code == 2 and out == "" and not (tmp_path / "out").exists(), argv
        assert err == ("error: head 'gap' returns no attention maps, so there is nothing to explain; explain works "
                       "with heads that attend over positions (abe, c-grouping, deml, dgml, diablo, g-grouping)\n")
    assert built == []


def edit_map(attention: torch.Tensor, k: int) -> torch.Tensor:
    """Map ``k`` of (B, P, h, w) maps with the half of its rows that does not hold its peak set to the lowest weight
    of all maps: the colour scale (lowest to highest weight) and every caption's peak stay as they were."""
    maps = attention.clone()
    for b in range(len(maps)):
        h = maps.shape[2]
        peak_row = int(maps[b, k].flatten().argmax()) // maps.shape[3]
        rows = slice(h // 2, h) if peak_row < h // 2 else slice(0, h // 2)
        maps[b, k, rows] = attention[b].min()
    return maps


def overlay_with(monkeypatch, tiles, run_dir, image, out, edit=None):
    """explain_images' overlay of ``image`` as pixels (H, W, 3), with the run's attention edited by ``edit``; the
    figure's panels are appended to ``tiles`` (matplotlib axes, input first)."""
    import numpy as np

    import deepmetric.viz.explain as explain

    def load(*args, **kwargs):
        model, config, path = load_run_model(*args, **kwargs)
        if edit is not None:
            forward = model.forward
            model.forward = lambda images: dataclasses.replace(out := forward(images), attention=edit(out.attention))
        return model, config, path

    monkeypatch.setattr(explain, "load_run_model", load)
    [path] = explain_images(run_dir, image, out, progress=False)
    with Image.open(path) as png:
        return np.asarray(png.convert("RGB"), dtype=np.int16)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_explain_serves_every_registered_head(head, tmp_path, image_folder, monkeypatch):
    """Each head either gets the one error, or has its maps drawn (eq. 10: upsampled over the image), one panel per
    map after the input: editing the weights of one map (the first, then the last) changes the figure inside that
    map's panel and nowhere else, and rendering the same maps again gives the same pixels."""
    import numpy as np

    import deepmetric.viz.overlays as overlays

    run_dir = tmp_path / "run"
    train(tiny_config(model={"head": head}, train={"steps": 1}), run_dir, progress=False)
    model, _, _ = load_run_model(run_dir)
    attention = model.eval()(torch.rand(1, 3, 16, 16)).attention
    if attention is None:
        with pytest.raises(DeepMetricError, match=f"head '{head}' returns no attention maps"):
            explain_images(run_dir, image_folder / "a.png", tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()
        return
    tiles, tile = [], overlays._tile
    monkeypatch.setattr(overlays, "_tile", lambda axes, *args: tiles.append(axes) or tile(axes, *args))
    image = image_folder / "a.png"
    plain = overlay_with(monkeypatch, tiles, run_dir, image, tmp_path / "plain")
    panels = len(tiles)
    assert panels == attention.shape[1] + 1  # the input, then one panel per map
    assert np.array_equal(overlay_with(monkeypatch, tiles, run_dir, image, tmp_path / "again"), plain)
    height = plain.shape[0]
    for k in sorted({0, attention.shape[1] - 1}):
        edited = overlay_with(monkeypatch, tiles, run_dir, image, tmp_path / f"edit{k}", lambda a, k=k: edit_map(a, k))
        ys, xs = np.nonzero((edited != plain).any(axis=2))
        assert len(xs) > 0, f"editing map {k + 1} left the figure unchanged"
        box = tiles[-panels + k + 1].get_window_extent()  # map k's panel, in pixels from the bottom left
        assert box.x0 - 1 <= xs.min() and xs.max() <= box.x1 + 1, (k, xs.min(), xs.max(), box)
        assert box.y0 - 1 <= height - 1 - ys.max() and height - 1 - ys.min() <= box.y1 + 1, (k, box)


def test_upsample_is_bilinear_to_the_image_size():
    maps = torch.tensor([[[0.0, 1.0], [0.0, 1.0]], [[0.25, 0.25], [0.25, 0.25]]])
    up = upsample(maps, (8, 6))
    assert up.shape == (2, 8, 6)
    assert up[0].min() == 0.0 and up[0].max() == 1.0 and (up[0][:, 1:] >= up[0][:, :-1]).all()  # a ramp
    assert abs(up[1] - 0.25).max() < 1e-7  # a uniform map stays uniform


def test_the_top_images_captions_fit_their_panels_and_never_overlap(monkeypatch):
    """Issue 53 item 10: ``explain --data`` on a folder of long class names drew captions over each other. Each
    caption is fitted to its panel's width (wrapped, at most two lines, cut in the middle with an ellipsis: the
    class name's start and the peak stay); no text of the figure overlaps another, nor a panel, nor leaves it."""
    import itertools

    import numpy as np

    import deepmetric.viz.overlays as overlays

    figures, render = [], overlays.figure_png
    monkeypatch.setattr(overlays, "figure_png", lambda figure, **kwargs: figures.append(figure) or render(figure,
                                                                                                          **kwargs))
    names = ["cat", "a-very-long-class-folder-name-of-an-icon-set-drawn-by-one-artist",
             "slightly smiling face with open mouth and smiling eyes", "WWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWWW",
             "$x$ and a very long name with dollars"]
    image = np.full((32, 32, 3), 0.5)
    rows = [[(image, torch.rand(4, 4), f"{name} 0.{g}{i}") for i, name in enumerate(names)] for g in range(3)]
    title = ("dgml: per group, the 5 test images of folder:/home/someone/datasets/a-long-folder-of-icons with the "
             "highest attention peak (caption: class, peak weight)")
    png = overlays.top_images_grid(rows, title, "group")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    [figure] = figures
    renderer = figure.canvas.get_renderer()
    panels = [axes for axes in figure.axes if axes.images]
    captions = [axes.title for axes in panels]
    assert len(panels) == 15 and captions[0].get_text() == "cat 0.00"
    for caption, (name, peak) in zip(captions, [(n, f"0.{g}{i}") for g in range(3) for i, n in enumerate(names)],
                                     strict=True):
        text = caption.get_text()
        assert text.count("\n") <= 1 and text.endswith(peak) and text.startswith(name[:3]), text
        assert "…" in text or f"{name} {peak}" in (text.replace("\n", " "), text.replace("\n", "")), text
    texts = [t for t in [*captions, figure._suptitle] if t is not None and t.get_text()]
    texts += [axes.yaxis.label for axes in panels if axes.yaxis.label.get_text()]
    boxes = [t.get_window_extent(renderer) for t in texts]
    frame = figure.bbox
    for text, box in zip(texts, boxes, strict=True):
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, \
            (text.get_text(), box, frame)
        for axes in panels:
            assert not box.overlaps(axes.get_window_extent(renderer)), (text.get_text(), box)
    for (a, first), (b, second) in itertools.combinations(zip(texts, boxes, strict=True), 2):
        assert not first.overlaps(second), (a.get_text(), b.get_text())


def test_names_with_dollars_draw_as_text_and_every_image_gets_its_own_overlay(tmp_path, capsys):
    """Issue 39, item 18: a file named `$\\frac$.png` died in matplotlib's math parser, and `dup.jpg` + `dup.png`
    or `sub/x.png` + `sub__x.png` wrote 4 overlays for 6 images while saying 6. Every figure's texts are drawn as
    written (a log axis' own ticks keep theirs), and each image gets a distinct overlay name."""
    from matplotlib.figure import Figure

    from deepmetric.render import figure_png
    from deepmetric.report.figures import recall_curve

    images = tmp_path / "images"
    (images / "sub").mkdir(parents=True)
    names = ["dup.jpg", "dup.png", "sub/x.png", "sub__x.png", "$\\frac{a}$.png", "Dup.PNG"]
    for i, name in enumerate(names):
        Image.new("RGB", (20, 20), (30 * i, 90, 200 - 30 * i)).save(images / name, format="PNG")
    run_dir = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--head", "dgml", "--out", run_dir)[0] == 0
    out = tmp_path / "explain"
    code, printed, err = run(capsys, "explain", run_dir, "--images", images, "--out", out, "--quiet")
    assert code == 0, err
    assert "wrote 6 attention overlays" in printed and len(list(out.iterdir())) == 6
    assert len({p.name.lower() for p in out.iterdir()}) == 6
    figure = Figure()
    axes = figure.add_subplot()
    axes.plot([1, 2], [1, 2], label="$\\undefinedmacro$ class")
    axes.legend()
    axes.set_title("variant $x^$")
    assert figure_png(figure).startswith(b"\x89PNG")
    assert recall_curve({"$run$": {"recall@1": 0.5, "recall@2": 0.6, "recall@4": 0.7}}).startswith(b"\x89PNG")


def test_explain_takes_several_images_and_the_run_after_them(tmp_path, image_folder, capsys):
    """As index and embed: several --images (repeats drawn once, names below the folder holding them all), the
    run's folder before or after the list, and the missing run still argparse's own error."""
    run_dir = tmp_path / "run"
    assert run(capsys, "train", *TINY, "--head", "dgml", "--out", run_dir)[0] == 0
    out = tmp_path / "explain"
    code, printed, err = run(capsys, "explain", "--images", image_folder / "sub", image_folder / "a.png",
                             image_folder / "sub" / "a.png", run_dir, "--out", out, "--quiet")
    assert code == 0, err
    assert "wrote 2 attention overlays" in printed
    assert set(png_sizes(out)) == {"a.png", "sub__a.png"}
    out_flags = tmp_path / "flags"
    code, printed, err = run(capsys, "explain", run_dir, "--images", image_folder / "b.jpg", "--images",
                             image_folder / "sub", "--out", out_flags, "--quiet")
    assert code == 0, err
    assert set(png_sizes(out_flags)) == {"b.png", "sub__a.png"}
    with pytest.raises(SystemExit) as stopped:
        main(["explain", "--images", str(image_folder), "--out", str(out)])
    assert stopped.value.code == 2 and "required: run_dir" in capsys.readouterr().err

"""``data.cache``: the decoded-image cache and the batched augmentation against ``TrainTransform``."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from deepmetric.data import cache as cache_module
from deepmetric.data.batched_transforms import BatchedTrainTransform, cache_image, cached_size, draw_crop, largest_side
from deepmetric.data.cache import CachedBatches, ImageCache, cache_device, read_shape
from deepmetric.data.sampler import PKSampler
from deepmetric.data.torch_dataset import ImageDataset, training_loader
from deepmetric.data.transforms import TrainTransform
from deepmetric.errors import DataError
from helpers import assert_resumed_exactly, make_table, tiny_config, train_straight_and_resumed

PADS = ("size", "square", "stretch")
LEVEL = 1 / 255 + 1e-6
NO_JITTER, JITTER = (0.0, 0.0, 0.0, 0.0), (0.4, 0.4, 0.4, 0.1)


def noise(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3)).astype(np.uint8)


def smooth(height: int, width: int) -> np.ndarray:
    """A smooth image (gradients and a soft disc): resizing it twice changes it little."""
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    disc = np.exp(-((y - 0.4) ** 2 + (x - 0.6) ** 2) * 12)
    return (np.stack([x, y, disc], axis=-1) * 255).round().astype(np.uint8)


def training_blobs():
    """The training split of a 6-class blob table and its labels numbered 0..5."""
    table = make_table(n_classes=6, per_class=5, size=24).split("train")
    return table, np.searchsorted(np.unique(table.labels), table.labels)


def assert_each_images_own_crop(images: list[np.ndarray], seeds: list[int], size: int = 16,
                                resize_range=(0.8, 1.5)) -> None:
    """The batch of ``images`` gives each the crop it gets alone (to one level)."""
    cached = [cache_image(i, size, resize_range, "size") for i in images]
    batch = BatchedTrainTransform(size, resize_range)(cached, [i.shape[:2] for i in images], seeds)
    for k, image in enumerate(images):
        alone = BatchedTrainTransform(size, resize_range)([cached[k]], [image.shape[:2]], [seeds[k]])
        assert torch.allclose(batch[k], alone[0], atol=LEVEL)


def both(image: np.ndarray, seeds, size: int, resize_range, pad: str, flip: bool = True):
    """(batched crops, TrainTransform's crops) of ``image`` for ``seeds``."""
    cached = cache_image(image, size, resize_range, pad)
    batched = BatchedTrainTransform(size, resize_range, flip, pad)([cached] * len(seeds),
                                                                   [image.shape[:2]] * len(seeds), seeds)
    reference = torch.stack([TrainTransform(size, resize_range, flip, pad)(image, s) for s in seeds])
    return batched, reference


@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("shape", [(12, 12), (20, 28), (29, 9), (5, 7), (16, 24)])
def test_same_seed_gives_the_same_crop_to_one_level_for_images_within_the_cached_size(pad, shape):
    """Same seeds -> same scale, position and flip: on noise images any other draw would differ by far more than
    the one 8-bit level that torch's fixed-point uint8 resize may round differently."""
    size, resize_range = 16, (0.6, 1.8)
    image = noise(*shape)
    assert cached_size(*shape, size, resize_range, pad) == shape  # kept as read: the exact path
    batched, reference = both(image, list(range(60)), size, resize_range, pad)
    assert batched.shape == reference.shape == (60, 3, size, size) and batched.dtype == torch.float32
    assert (batched - reference).abs().max() <= LEVEL
    assert (batched - reference).abs().mean() < 0.2 / 255


@pytest.mark.parametrize("shape", [(1, 60), (60, 1), (2, 90)])
def test_a_thin_image_keeps_one_pixel_across_in_the_cache_and_the_crop(shape):
    """A side that rounds to 0 pixels when shrunk is kept at 1, in the cache as in ``TrainTransform``'s resize."""
    size, resize_range = 16, (0.6, 1.5)
    image = smooth(*shape)
    kept = cached_size(*shape, size, resize_range, "size")
    assert min(kept) == 1 and max(kept) == largest_side(size, resize_range)
    batched, reference = both(image, list(range(30)), size, resize_range, "size")
    assert (batched - reference).abs().max() <= 2 * LEVEL  # shrunk twice (a smooth image): within a level or two


def test_an_image_at_the_cached_size_drawn_at_scale_one_without_flip_is_cropped_identically():
    size = 16
    image = noise(16, 16, seed=3)
    crop = BatchedTrainTransform(size, (1.0, 1.0), flip=False)([cache_image(image, size, (1.0, 1.0), "size")],
                                                              [(16, 16)], [7])
    assert torch.equal(crop[0], TrainTransform(size, (1.0, 1.0), flip=False)(image, 7))
    assert torch.equal(crop[0], torch.from_numpy(image).permute(2, 0, 1).float() / 255)


@pytest.mark.parametrize("pad", PADS)
def test_the_draws_have_trainTransforms_distribution(pad):
    """Scale uniform on [lo, hi] (the longer side's mean and range), crop offsets spread over their range, flips at
    one half, none with flip off."""
    size, (lo, hi) = 20, (0.8, 1.8)
    draws = [draw_crop(seed, 30, 40, size, (lo, hi), True, pad) for seed in range(4000)]
    longer = np.array([max(d.height, d.width) for d in draws])
    assert longer.min() >= round(lo * size) and longer.max() <= round(hi * size) <= largest_side(size, (lo, hi))
    assert abs(longer.mean() - (lo + hi) / 2 * size) < 0.3
    flips = np.mean([d.flip for d in draws])
    assert abs(flips - 0.5) < 4 * np.sqrt(0.25 / len(draws))
    assert not any(d.flip for d in (draw_crop(s, 30, 40, size, (lo, hi), False, pad) for s in range(200)))
    if pad == "stretch":
        assert all(d.height == d.width for d in draws)
    else:
        assert all(abs(d.height / d.width - 0.75) < 0.1 for d in draws)
    # where the resized image exceeds the crop, the crop stays inside it; where it is smaller, it is centred
    for d in draws:
        if d.width >= size and pad != "square":
            assert 0 <= d.column <= d.width - size
        if d.width < size and pad == "size":
            assert d.column == -((size - d.width) // 2)


@pytest.mark.parametrize("pad", PADS)
def test_images_larger_than_the_cache_keeps_match_in_distribution(pad):
    """An image shrunk by the cache is resized twice (both antialiased): per seed close, and the mean and the
    per-pixel spread of many crops as TrainTransform's."""
    size, resize_range = 16, (0.6, 1.8)
    image = smooth(64, 48)
    assert max(cached_size(64, 48, size, resize_range, pad)) == largest_side(size, resize_range) == 29
    batched, reference = both(image, list(range(300)), size, resize_range, pad)
    assert (batched - reference).abs().mean() < 2 / 255
    assert (batched.mean(0) - reference.mean(0)).abs().max() < 2 / 255
    assert (batched.std(0) - reference.std(0)).abs().max() < 2 / 255


def test_a_batch_of_images_of_different_sizes_is_each_images_own_crop():
    assert_each_images_own_crop([noise(10, 14, 1), noise(24, 8, 2), noise(16, 16, 3), smooth(40, 30)], [11, 12, 13, 14])


@pytest.mark.parametrize("jitter", [NO_JITTER, JITTER], ids=["no-jitter", "jitter"])
def test_a_batch_is_made_without_reading_a_value_back_from_its_device(monkeypatch, jitter):
    """On a GPU a value read from a device tensor makes the host wait for everything queued before it, the training
    step included, so the thread that makes the next batch could not work ahead (the filter's width was read so
    until 2026-11-28). Here every read of a tensor's value fails; the batch is made all the same, colour jitter
    included."""
    size, resize_range = 16, (0.8, 1.5)
    images = [noise(10, 14, 1), noise(24, 8, 2), smooth(40, 30)]
    cached = [cache_image(i, size, resize_range, "size") for i in images]
    shapes, seeds = [i.shape[:2] for i in images], [1, 2, 3]
    expected = BatchedTrainTransform(size, resize_range, color_jitter=jitter)(cached, shapes, seeds)

    def read(*_):
        raise AssertionError("a tensor's value was read on the host")

    for name in ("item", "tolist", "__float__", "__int__", "__bool__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, read)
    batch = BatchedTrainTransform(size, resize_range, color_jitter=jitter)(cached, shapes, seeds)
    monkeypatch.undo()
    assert torch.equal(batch, expected)


@pytest.mark.parametrize("jitter, levels", [(NO_JITTER, 1), (JITTER, 8)], ids=["no-jitter", "jitter"])
def test_cached_batches_are_the_loaders_batches_to_one_level(jitter, levels):
    """The same rows and labels, and images to the crops' one level (with colour jitter: as the jitter amplifies it,
    ``test_color_jitter.py``)."""
    table, labels = training_blobs()
    size, resize_range = 20, (0.8, 1.3)

    def sampler():
        return PKSampler(labels, 2, 3, seed=5, num_steps=4)

    cache = ImageCache.build(table, size, resize_range, "size")
    augment = BatchedTrainTransform(size, resize_range, color_jitter=jitter)
    cached = list(CachedBatches(cache, sampler(), labels, augment, "cpu"))
    transform = TrainTransform(size, resize_range, color_jitter=jitter)
    loaded = list(training_loader(ImageDataset(table, transform, labels), sampler(), 0))
    assert len(cached) == len(loaded) == 4
    for (images, y, rows), (images_ref, y_ref, rows_ref) in zip(cached, loaded, strict=True):
        assert torch.equal(rows, rows_ref) and torch.equal(y, y_ref)
        assert (images - images_ref).abs().max() <= levels * LEVEL


def test_cached_batches_made_ahead_by_a_thread_are_the_same_batches():
    """``prefetch`` (the default on a GPU) forced on the CPU: the same tensors in the same order; the default follows
    the device."""
    table, labels = training_blobs()
    cache = ImageCache.build(table, 20, (0.8, 1.3), "size")

    def batches(prefetch):
        return CachedBatches(cache, PKSampler(labels, 2, 3, seed=5, num_steps=5), labels,
                             BatchedTrainTransform(20, (0.8, 1.3)), "cpu", prefetch=prefetch)

    ahead, in_turn = list(batches(True)), list(batches(False))
    assert len(ahead) == len(in_turn) == 5
    for made_ahead, made_in_turn in zip(ahead, in_turn, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(made_ahead, made_in_turn, strict=True))
    assert batches(None).prefetch is False
    assert CachedBatches(cache, [], labels, BatchedTrainTransform(20), "cuda:0").prefetch is True


def test_the_cache_keeps_each_image_no_larger_than_the_augmentation_uses():
    assert cached_size(100, 50, 20, (0.8, 1.8), "size") == (36, 18)
    assert cached_size(100, 50, 20, (0.8, 1.8), "stretch") == (36, 36)
    assert cached_size(30, 10, 20, (0.8, 1.8), "square") == (30, 10)
    table = make_table(n_classes=2, per_class=3, size=48)
    cache = ImageCache.build(table, 16, (1.0, 1.5), "size")
    assert {tuple(i.shape) for i in cache.images} == {(3, 24, 24)} and set(cache.shapes) == {(48, 48)}
    assert cache.nbytes == 6 * 3 * 24 * 24 and cache.device == torch.device("cpu")


def test_training_with_the_cache_trains_and_resumes_exactly(tmp_path):
    straight, resumed, _ = train_straight_and_resumed(tmp_path, steps=4, stop=2, data={"cache": True})
    assert_resumed_exactly(straight, resumed, 4)
    assert all(torch.isfinite(v).all() for k, v in straight[0].items() if k.startswith("model."))


def test_a_cache_that_would_not_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from deepmetric.training import train

    monkeypatch.setattr(cache_module, "available_memory", lambda: 1000)
    with pytest.raises(DataError, match=r"data\.cache.*need about .* [KMG]iB.*set data\.cache=false"):
        train(tiny_config(data={"cache": True}), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "config.yaml").exists()
    with pytest.raises(DataError, match="data.image_size or data.resize_range"):
        ImageCache.build(make_table(), 16, (1.0, 1.2), "size")


def png_table(tmp_path, shapes, boxes=None):
    """A training table of PNG files of ``shapes`` ((height, width) each), two classes, with ``boxes`` if given."""
    from PIL import Image

    from deepmetric.data.table import RetrievalTable

    paths = []
    for k, (h, w) in enumerate(shapes):
        path = tmp_path / f"{k}.png"
        Image.fromarray(noise(h, w, k)).save(path)
        paths.append(str(path))
    n = len(paths)
    return RetrievalTable("pngs", paths, np.arange(n) % 2, ["train"] * n, np.ones(n, bool), np.ones(n, bool),
                          boxes=None if boxes is None else np.asarray(boxes, dtype=float))


@pytest.mark.parametrize("pad", PADS)
def test_a_cache_of_files_estimates_from_the_headers_what_it_then_holds(tmp_path, pad, capsys):
    """Shapes read from the files' headers (no decoding), bounding boxes applied as ``table.image`` applies them (one
    box partly outside its image), are the shapes of the images decoded; the bytes estimated before decoding are the
    bytes the cache then holds; both passes show a progress line."""
    shapes = [(30, 50), (64, 20), (12, 12), (80, 80)]
    boxes = [(5, 2, 45, 28), (0, 10, 20, 60), (-4, -3, 30, 9), (10.5, 20.2, 70, 61)]
    for table in (png_table(tmp_path, shapes), png_table(tmp_path, shapes, boxes)):
        size, resize_range = 16, (0.8, 1.5)
        estimated, needed = ImageCache.estimate(table, size, resize_range, pad)
        assert estimated == [table.image(row).shape[:2] for row in range(len(table))]
        cache = ImageCache.build(table, size, resize_range, pad)
        assert capsys.readouterr().err == ""  # no progress unless asked
        assert cache.shapes == estimated and cache.nbytes == needed
        assert [tuple(i.shape[1:]) for i in cache.images] == [cached_size(*s, size, resize_range, pad)
                                                              for s in estimated]
        ImageCache.build(table, size, resize_range, pad, progress=True)
        lines = capsys.readouterr().err.splitlines()
        for bar in ("cache: image sizes", "cache: decoding"):
            assert any(re.match(rf"^{bar}: 4/4 .*image/s\]$", line) for line in lines), (bar, lines)
    assert estimated[2] == (9, 12) and estimated[3] == (41, 60)  # the boxes clipped and rounded outwards
    assert len({s for s in estimated}) == 4


def test_a_box_outside_its_image_and_an_unreadable_file_are_named(tmp_path):
    table = png_table(tmp_path, [(20, 30), (20, 30)], boxes=[(40, 0, 50, 10), (0, 0, 10, 10)])
    assert read_shape(table, 0) == (1, 1)  # table.image then names the problem
    with pytest.raises(DataError, match=r"image .*0\.png: .*box"):
        ImageCache.build(table, 16, (1.0, 1.2), "size")
    (tmp_path / "1.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=rf"^image {tmp_path / '1.png'} cannot be read: "):
        read_shape(table, 1)


def test_available_memory_is_the_kernels_estimate_of_what_new_allocations_can_take(monkeypatch):
    import os
    from pathlib import Path

    meminfo = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\nMemAvailable:   12345678 kB\n"
    monkeypatch.setattr(Path, "read_text", lambda self: meminfo if str(self) == "/proc/meminfo" else "")
    assert cache_module.available_memory() == 12345678 * 1024

    def unreadable(*_):
        raise OSError("no /proc here")

    monkeypatch.setattr(Path, "read_text", unreadable)
    free_pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert abs(cache_module.available_memory() - free_pages) < 2**28


def test_the_cache_is_refused_only_past_its_share_of_the_memory_and_the_message_gives_the_figures(monkeypatch):
    table = make_table(n_classes=2, per_class=3, size=48)  # 6 images kept at 24 x 24: 10,368 bytes
    needed = 6 * 3 * 24 * 24
    monkeypatch.setattr(cache_module, "available_memory", lambda: needed / cache_module.HOST_SHARE)
    assert ImageCache.build(table, 16, (1.0, 1.5), "size").nbytes == needed  # exactly the share: kept
    available = 2**30 * 0.5
    monkeypatch.setattr(cache_module, "available_memory", lambda: available)
    monkeypatch.setattr(cache_module, "HOST_SHARE", needed / available / 2)
    with pytest.raises(DataError, match=r"^data\.cache: the 6 training images decoded \(longer side up to 24 px, "
                                        r"ceil\(data\.resize_range\[1\] x data\.image_size\)\) need about 10\.1 KiB, "
                                        r"more than 0% of the 512\.0 MiB of memory available; set data\.cache=false"):
        ImageCache.build(table, 16, (1.0, 1.5), "size")


def test_the_refusal_counts_each_pad_modes_bytes(tmp_path, monkeypatch):
    """``pad="stretch"`` keeps a 90 x 40 image at 24 x 24 where the other modes keep 24 x 11: a memory that holds the
    latter and not the former refuses the stretched cache only."""
    table = png_table(tmp_path, [(90, 40)] * 2)
    monkeypatch.setattr(cache_module, "available_memory", lambda: (2 * 3 * 24 * 24 - 1) / cache_module.HOST_SHARE)
    assert ImageCache.build(table, 16, (1.0, 1.5), "size").nbytes == 2 * 3 * 24 * 11
    with pytest.raises(DataError, match="need about"):
        ImageCache.build(table, 16, (1.0, 1.5), "stretch")


def test_a_gpu_keeps_the_cache_when_it_fits_in_its_share_and_says_when_it_does_not(monkeypatch, caplog):

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(cache_module, "free_gpu_memory", lambda device: 3 * 2**30 if device == gpu else 0)
    assert cache_device(int(1.5 * 2**30), gpu) == gpu  # exactly half of the free memory
    assert cache_device(1, torch.device("cpu")) == torch.device("cpu")
    with caplog.at_level("INFO", logger="deepmetric"):
        assert cache_device(int(1.5 * 2**30) + 1, gpu) == torch.device("cpu")
    assert caplog.messages == ["data.cache: 1.50 GiB of images would take more than 50% of the GPU's free 3.00 GiB; "
                               "kept in memory and copied a batch at a time"]


def test_building_the_cache_logs_what_it_holds_and_where(caplog):
    with caplog.at_level("INFO", logger="deepmetric"):
        ImageCache.build(make_table(n_classes=2, per_class=3, size=48), 16, (1.0, 1.5), "size")
    assert caplog.messages == ["data.cache: 6 training images decoded once, 10.1 KiB on cpu"]


def test_a_large_image_is_kept_shrunk_with_the_antialiased_resize_and_each_pad_modes_sides():
    from torchvision.transforms.v2 import functional as F

    from deepmetric.data.transforms import to_tensor

    image = noise(90, 40, 3)
    kept = cache_image(image, 20, (0.8, 1.5), "size")
    assert torch.equal(kept, F.resize(to_tensor(image), [30, 13], antialias=True))
    assert tuple(cache_image(image, 20, (0.8, 1.5), "stretch").shape) == (3, 30, 30)
    small = noise(20, 9, 4)
    assert torch.equal(cache_image(small, 20, (0.8, 1.5), "size"), to_tensor(small))  # kept as read


def test_a_batch_whose_images_share_one_side_only_is_each_images_own_crop():
    for images in ([noise(20, 10, 1), noise(20, 24, 2)], [noise(12, 18, 3), noise(20, 18, 4)],
                   [noise(18, 18, 5), noise(18, 18, 6)]):
        assert_each_images_own_crop(images, [7, 8])


def test_cached_batches_label_with_int64_and_make_the_batches_in_the_thread_when_asked():
    import threading

    table, labels = training_blobs()
    labels = labels.astype(np.int32)
    cache = ImageCache.build(table, 20, (0.8, 1.3), "size")
    makers = []

    class Recording(BatchedTrainTransform):
        def __call__(self, *args, **kwargs):
            makers.append(threading.current_thread())
            return super().__call__(*args, **kwargs)

    for prefetch in (True, False):
        batches = list(CachedBatches(cache, PKSampler(labels, 2, 3, seed=5, num_steps=2), labels,
                                     Recording(20, (0.8, 1.3)), "cpu", prefetch=prefetch))
        assert all(y.dtype == torch.int64 and rows.dtype == torch.int64 for _, y, rows in batches)
        thread = makers[-1]
        assert (thread.name == "deepmetric-prefetch" and thread.daemon) if prefetch else \
            thread is threading.main_thread()


def test_a_transform_with_an_unknown_pad_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^pad must be one of \('size', 'square', 'stretch'\), got 'mirror'$"):
        BatchedTrainTransform(16, pad="mirror")

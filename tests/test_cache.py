"""``data.cache``: the decoded-image cache and the batched augmentation against ``TrainTransform``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deepmetric.data.batched_transforms import BatchedTrainTransform, cache_image, cached_size, draw_crop, largest_side
from deepmetric.data.cache import CachedBatches, ImageCache
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
    size, resize_range = 16, (0.8, 1.5)
    images = [noise(10, 14, 1), noise(24, 8, 2), noise(16, 16, 3), smooth(40, 30)]
    cached = [cache_image(i, size, resize_range, "size") for i in images]
    seeds = [11, 12, 13, 14]
    batch = BatchedTrainTransform(size, resize_range)(cached, [i.shape[:2] for i in images], seeds)
    for k, image in enumerate(images):
        alone = BatchedTrainTransform(size, resize_range)([cached[k]], [image.shape[:2]], [seeds[k]])
        assert torch.allclose(batch[k], alone[0], atol=LEVEL)


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
    table = make_table(n_classes=6, per_class=5, size=24).split("train")
    labels = np.searchsorted(np.unique(table.labels), table.labels)
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
    table = make_table(n_classes=6, per_class=5, size=24).split("train")
    labels = np.searchsorted(np.unique(table.labels), table.labels)
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
    import deepmetric.data.cache as cache_module
    from deepmetric.training import train

    monkeypatch.setattr(cache_module, "available_memory", lambda: 1000)
    with pytest.raises(DataError, match=r"data\.cache.*need about .* GiB.*set data\.cache=false"):
        train(tiny_config(data={"cache": True}), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "config.yaml").exists()
    with pytest.raises(DataError, match="data.image_size or data.resize_range"):
        ImageCache.build(make_table(), 16, (1.0, 1.2), "size")

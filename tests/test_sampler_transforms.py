"""The P x K sampler and the seeded transforms."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from deepmetric.data import PKSampler, TrainTransform
from deepmetric.data import TestTransform as ResizeForTest
from deepmetric.data.resizing import TEST_RESIZE_MODES, TRAIN_PAD_MODES
from deepmetric.data.torch_dataset import uint8_batches
from deepmetric.data.transforms import as_unit_float
from deepmetric.errors import DataError


def labels_with_sizes(sizes):
    return np.concatenate([np.full(n, c) for c, n in enumerate(sizes)])


def test_batches_are_p_classes_times_k_images():
    labels = labels_with_sizes([10] * 12)
    sampler = PKSampler(labels, classes_per_batch=4, samples_per_class=3, seed=1, num_steps=20)
    for batch in sampler:
        rows = [r for r, _ in batch]
        counts = Counter(labels[rows].tolist())
        assert len(rows) == 12 and len(counts) == 4 and set(counts.values()) == {3}
        assert len(set(rows)) == 12  # classes with >= K images never repeat an image in a batch
        per_class = [labels[rows[i:i + 3]] for i in range(0, 12, 3)]
        assert all(len(set(chunk.tolist())) == 1 for chunk in per_class)  # class-major


def test_every_class_once_per_epoch():
    labels = labels_with_sizes([5] * 9)
    sampler = PKSampler(labels, classes_per_batch=3, samples_per_class=2, seed=0)
    for epoch in range(3):
        seen = [c for step in range(3 * epoch, 3 * epoch + 3) for c in sampler.classes_of_step(step).tolist()]
        assert sorted(seen) == list(range(9))


def test_small_classes_repeat_evenly_and_singletons_are_dropped():
    labels = labels_with_sizes([2, 3, 8, 8, 1])
    sampler = PKSampler(labels, classes_per_batch=2, samples_per_class=5, seed=0)
    assert sampler.dropped_classes.tolist() == [4]
    for step in range(10):
        rows = sampler.global_batch(step)
        for start in range(0, len(rows), 5):
            chunk = rows[start:start + 5]
            n = (labels == labels[chunk[0]]).sum()
            assert max(Counter(chunk).values()) <= -(-5 // n)  # at most ceil(K / n) copies


def test_deterministic_and_resumable():
    labels = labels_with_sizes([7] * 10)
    full = list(PKSampler(labels, 3, 4, seed=5, num_steps=12))
    resumed = list(PKSampler(labels, 3, 4, seed=5, start_step=7, num_steps=12))
    assert full[7:] == resumed
    other = list(PKSampler(labels, 3, 4, seed=6, num_steps=12))
    assert full != other


def test_ranks_shard_the_global_batch():
    labels = labels_with_sizes([6] * 8)
    single = PKSampler(labels, 4, 4, seed=2)
    shards = [PKSampler(labels, 4, 4, seed=2, rank=r, world_size=2) for r in range(2)]
    for step in range(5):
        assert shards[0].batch(step) + shards[1].batch(step) == single.batch(step)


def test_too_few_classes_is_an_error():
    with pytest.raises(DataError, match="needs 5 classes"):
        PKSampler(labels_with_sizes([3, 3, 1]), 5, 2)


def test_a_class_is_covered_before_its_images_repeat():
    labels = labels_with_sizes([9] * 4)
    sampler = PKSampler(labels, 2, 3, seed=3)  # 3 chunks of 3 cover the 9 images of a class
    seen = {c: [] for c in range(4)}
    for step in range(2 * 3):  # 3 epochs of 2 steps: every class drawn 3 times
        rows = sampler.global_batch(step)
        for r in rows:
            seen[int(labels[r])].append(r)
    assert all(len(set(v)) == 9 for v in seen.values())


def test_train_transform_is_a_function_of_the_seed():
    image = np.random.default_rng(0).integers(0, 255, size=(40, 30, 3), dtype=np.uint8)
    transform = TrainTransform(24, (0.8, 1.8), flip=True)
    a, b, c = transform(image, 7), transform(image, 7), transform(image, 8)
    assert a.shape == (3, 24, 24) and a.dtype == torch.float32 and 0 <= a.min() and a.max() <= 1
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_small_images_are_padded_and_grayscale_becomes_rgb():
    gray = np.full((10, 6), 200, dtype=np.uint8)
    out = TrainTransform(32, (0.5, 0.5), flip=False)(gray, 0)  # longer side 16 < 32: centred on black
    assert out.shape == (3, 32, 32)
    assert torch.equal(out[0], out[1]) and out.max() == pytest.approx(200 / 255) and out.min() == 0


def test_flip_off_never_flips():
    image = np.zeros((16, 16, 3), dtype=np.uint8)
    image[:, :4] = 255  # left band
    transform = TrainTransform(16, (1.0, 1.0), flip=False)
    assert all(transform(image, s)[0, :, 0].mean() > 0.9 for s in range(20))


def test_test_transforms():
    image = np.random.default_rng(1).integers(0, 255, size=(50, 80, 3), dtype=np.uint8)
    assert ResizeForTest(32, "resize")(image).shape == (3, 32, 32)
    assert ResizeForTest(32, "resize_crop")(image).shape == (3, 32, 32)
    with pytest.raises(ValueError, match="mode must be one of"):
        ResizeForTest(32, "stretch")


@pytest.mark.parametrize("pad", TRAIN_PAD_MODES)
@pytest.mark.parametrize("mode", TEST_RESIZE_MODES)
def test_uint8_outputs_become_the_float_outputs_bit_for_bit(pad, mode):
    """``uint8=True`` (a GPU's loaders: a quarter of the bytes) stops before the float conversion, which
    ``as_unit_float`` then does: the transforms' own float outputs exactly, for every padding, resizing, crop, flip
    and grayscale image; a float tensor (``data.cache``'s batches) goes through ``as_unit_float`` untouched."""
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, size=(37, 23, 3), dtype=np.uint8), rng.integers(0, 256, size=(9, 50),
                                                                                   dtype=np.uint8)]
    transforms = [(TrainTransform(24, (0.6, 1.7), True, pad), TrainTransform(24, (0.6, 1.7), True, pad, uint8=True)),
                  (ResizeForTest(24, mode), ResizeForTest(24, mode, uint8=True))]
    for as_float, as_uint8 in transforms:
        for image in images:
            for seed in range(6):
                pixels = as_uint8(image, seed)
                assert pixels.dtype == torch.uint8 and pixels.is_contiguous()
                assert torch.equal(as_unit_float(pixels), as_float(image, seed))
    batch = torch.rand(2, 3, 4, 4)
    assert as_unit_float(batch) is batch


def test_uint8_pixels_become_floats_by_a_correctly_rounded_division():
    """Every pixel value v as numpy's IEEE float32 v / 255 (a product with 1/255 differs for some v; that is what
    torch's CUDA kernels compute for a division by a Python number, so ``as_unit_float`` divides by a tensor)."""
    values = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16)
    expected = torch.from_numpy(np.arange(256, dtype=np.float32) / np.float32(255)).reshape(1, 1, 16, 16)
    assert torch.equal(as_unit_float(values), expected)
    assert not torch.equal(values.float() * (1 / 255.0), expected)  # the product is not the same numbers


def test_the_loaders_carry_uint8_to_a_gpu_only():
    assert uint8_batches("cuda") and uint8_batches(torch.device("cuda", 1))
    assert not uint8_batches("cpu") and not uint8_batches(torch.device("cpu"))


def test_pad_crop_keeps_the_aspect_ratio_and_pads_the_shorter_side():
    """ABE's test preprocessing: a white 40 x 80 image at size 32 -> longer side 37, 18 or 19 white rows
    centred on a black 37 x 37 square, centre crop 32: black above and below (``resize`` would squash it
    to all white)."""
    white = np.full((40, 80, 3), 255, dtype=np.uint8)
    out = ResizeForTest(32, "pad_crop")(white)
    assert out.shape == (3, 32, 32)
    rows = out[0].mean(dim=1)
    white_rows = int((rows > 0.99).sum())
    assert 17 <= white_rows <= 19 and rows[0] == 0 and rows[-1] == 0
    assert abs(int((rows[:16] == 0).sum()) - int((rows[16:] == 0).sum())) <= 1  # centred
    assert out[0, 16].min() > 0.99  # the longer side fills the crop
    assert ResizeForTest(32, "resize")(white).min() == 1.0


def test_short_crop_scales_the_shorter_side_and_crops_the_longer():
    """torchvision's Resize(256) + CenterCrop(224) at size 32: a 40 x 80 image becomes 37 x 74 (shorter side
    37 = round(256/224 x 32)), then its centre 32 x 32. A white 20 x 20 square at the image's centre stays a
    square (about 18 x 18); ``resize_crop`` squashes the 2:1 image, and the square, to half its width."""
    image = np.zeros((40, 80, 3), dtype=np.uint8)
    image[10:30, 30:50] = 255

    def white_extent(out: torch.Tensor) -> tuple[int, int]:
        white = out[0] > 0.5
        return int(white.any(dim=1).sum()), int(white.any(dim=0).sum())  # rows, columns

    out = ResizeForTest(32, "short_crop")(image)
    rows, columns = white_extent(out)
    assert out.shape == (3, 32, 32) and 17 <= rows <= 20 and abs(rows - columns) <= 1
    rows, columns = white_extent(ResizeForTest(32, "resize_crop")(image))
    assert abs(columns - rows / 2) <= 1.5
    tall = ResizeForTest(32, "short_crop")(np.full((80, 40, 3), 255, np.uint8))
    assert tall.min() == 1.0  # the shorter side fills the crop: nothing padded


def test_square_train_padding_moves_the_crop_across_the_padding():
    """ABE's training preprocessing: a white 40 x 80 image, longer side 48 (1.5 x 32): padded to 32 rows the
    white band (24 rows) always sits at the same height; padded to a 48 x 48 square, the random crop moves it."""

    def band_top(pad: str, seed: int) -> int:
        out = TrainTransform(32, (1.5, 1.5), flip=False, pad=pad)(np.full((40, 80, 3), 255, np.uint8), seed)
        return int((out[0].mean(dim=1) > 0.99).nonzero()[0])

    assert {band_top("size", seed) for seed in range(20)} == {4}
    assert len({band_top("square", seed) for seed in range(20)}) > 5
    with pytest.raises(ValueError, match="pad must be one of"):
        TrainTransform(32, pad="mirror")


def left_half_white(height: int, width: int) -> np.ndarray:
    image = np.zeros((height, width, 3), dtype=np.uint8)
    image[:, : width // 2] = 255
    return image


def test_stretch_resizes_both_sides_without_keeping_the_aspect_ratio():
    """ABE's cropped Cars-196: a 20 x 80 image whose left half is white, stretched to 37 x 37 (1.144 x 32) and
    centre-cropped to 32: every row is white on the left half and black on the right, no padding rows; the
    aspect-keeping ``pad_crop`` leaves black rows above and below instead."""
    out = ResizeForTest(32, "stretch_crop")(left_half_white(20, 80))
    assert out.shape == (3, 32, 32)
    columns = out[0].mean(dim=0)
    assert (out[0, :, :13] > 0.99).all() and (out[0, :, 19:] < 0.01).all()  # every row: white | black
    assert abs(int((columns > 0.5).sum()) - 16) <= 1  # the boundary at the centre (37 is centred on 32)
    padded = ResizeForTest(32, "pad_crop")(left_half_white(20, 80))
    assert padded[0, 0].max() == 0 and padded[0, -1].max() == 0

    # Training: 20 x 80 stretched to 48 x 48 (1.5 x 32), white columns 0-23, a random 32 x 32 crop
    crops = [TrainTransform(32, (1.5, 1.5), flip=False, pad="stretch")(left_half_white(20, 80), seed)
             for seed in range(20)]
    assert all(c.shape == (3, 32, 32) and (c[0].amax(dim=1) > 0.99).all() for c in crops)  # no black row
    white_columns = {int((c[0, 0] > 0.5).sum()) for c in crops}  # 24 - the crop's left offset (0-16)
    assert len(white_columns) > 5 and all(8 <= w <= 24 for w in white_columns)
    kept = TrainTransform(32, (1.5, 1.5), flip=False, pad="size")(left_half_white(20, 80), 0)
    assert (kept[0].amax(dim=1) == 0).sum() >= 16  # 12 x 48 keeps the aspect ratio: black rows above and below

"""``data.color_jitter``: the draws and the batched operations against torchvision's ``ColorJitter``, and the same
jitter with and without ``data.cache``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from deepmetric.data.batched_transforms import BatchedTrainTransform, cache_image
from deepmetric.data.color_jitter import (
    ADJUST,
    JitterDraw,
    adjust_hue,
    color_jitter,
    draw_jitter,
    from_sextant_and_chroma,
    sextant_and_chroma,
    to_levels,
)
from deepmetric.data.jitter_options import check_strengths
from deepmetric.data.transforms import TrainTransform, as_unit_float
from deepmetric.errors import ConfigError
from helpers import assert_resumed_exactly, tiny_config, train_straight_and_resumed

STRONG = (0.4, 0.4, 0.4, 0.1)
TORCHVISION = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)


def images(count: int, height: int = 11, width: int = 9, seed: int = 0) -> torch.Tensor:
    """Random colours, with the cases HSV treats apart: grey pixels, two channels tied for the largest, black."""
    generator = torch.Generator().manual_seed(seed)
    batch = torch.rand(count, 3, height, width, generator=generator)
    batch[0] = batch[0, :1]  # grey
    batch[1] = (batch[1] * 3).round() / 3  # many ties between channels
    batch[2, :, :3] = 0  # black rows
    batch[3, 0] = batch[3, 1]  # R = G everywhere
    return batch


def torchvision_jitter(image: torch.Tensor, draw: JitterDraw) -> torch.Tensor:
    for operation in draw.order:
        if draw.factors[operation] is not None:
            image = TORCHVISION[operation](image, draw.factors[operation])
    return image


@pytest.mark.parametrize("strengths", [STRONG, (0.8, 0.0, 1.5, 0.5), (0.0, 0.0, 0.0, 0.3), (2.0, 0.0, 0.0, 0.0)])
def test_the_batch_is_jittered_as_torchvision_jitters_each_image_in_its_draws_order(strengths):
    batch = images(40)
    rng = np.random.default_rng(3)
    draws = [draw_jitter(rng, strengths) for _ in range(len(batch))]
    jittered = color_jitter(batch, draws)
    reference = torch.stack([torchvision_jitter(image, draw) for image, draw in zip(batch, draws, strict=True)])
    assert jittered.shape == batch.shape and jittered.dtype == torch.float32
    assert (jittered - reference).abs().max() < 5e-6
    assert not torch.equal(jittered, batch) and (jittered - batch).abs().mean() > 0.01


@pytest.mark.parametrize("operation", range(4))
def test_each_operation_is_torchvisions_with_one_factor_per_image(operation):
    batch = images(12, seed=operation)
    factors = torch.linspace(-0.5, 0.5, 12) if operation == 3 else torch.linspace(0.0, 2.5, 12)
    ours = ADJUST[operation](batch, factors)
    reference = torch.stack([TORCHVISION[operation](image, float(f)) for image, f in zip(batch, factors, strict=True)])
    assert (ours - reference).abs().max() < 5e-6
    assert ours.min() >= 0 and ours.max() <= 1


def test_the_hue_in_sextants_is_undone_and_a_full_turn_changes_nothing():
    batch = images(8)
    sextant, value, chroma = sextant_and_chroma(batch)
    assert sextant.min() >= 0 and sextant.max() < 6 and (chroma >= 0).all()
    assert (sextant[0] == 0).all() and (chroma[0] == 0).all()  # grey: no hue, no chroma
    assert (from_sextant_and_chroma(sextant, value, chroma) - batch).abs().max() < 1e-6
    assert (from_sextant_and_chroma(sextant + 12, value, chroma) - batch).abs().max() < 1e-5
    assert (adjust_hue(batch, torch.full((8,), 0.5)) - adjust_hue(batch, torch.full((8,), -0.5))).abs().max() < 1e-5


def test_the_draws_have_torchvisions_ranges_and_every_order():
    """Each factor within ColorJitter's own interval for that strength, spread uniformly over it (mean and ends),
    every one of the 24 orders drawn, and an operation of strength zero never drawn."""
    for strengths in (STRONG, (1.5, 0.2, 0.0, 0.5)):
        reference = v2.ColorJitter(*strengths)
        intervals = [reference.brightness, reference.contrast, reference.saturation, reference.hue]
        rng = np.random.default_rng(0)
        draws = [draw_jitter(rng, strengths) for _ in range(4000)]
        assert {d.order for d in draws} == set(itertools.permutations(range(4)))
        for k, interval in enumerate(intervals):
            values = np.array([d.factors[k] for d in draws], dtype=float)
            if interval is None:
                assert np.isnan(values).all()
                continue
            lo, hi = interval
            assert values.min() >= lo and values.max() <= hi
            assert abs(values.mean() - (lo + hi) / 2) < 4 * (hi - lo) / np.sqrt(12 * len(values))
            assert values.min() < lo + 0.01 * (hi - lo) and values.max() > hi - 0.01 * (hi - lo)


def test_no_jitter_draws_nothing_so_a_run_without_it_sees_the_pixels_it_saw_before():
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    assert draw_jitter(rng, (0.0, 0.0, 0.0, 0.0)) is None and rng.bit_generator.state == state
    image = np.random.default_rng(1).integers(0, 256, (20, 14, 3)).astype(np.uint8)
    off = TrainTransform(16, (0.8, 1.5))
    assert all(torch.equal(off(image, s), TrainTransform(16, (0.8, 1.5), color_jitter=(0, 0, 0, 0))(image, s))
               for s in range(5))
    assert color_jitter(images(4), [None] * 4).equal(images(4))


def test_the_jitter_is_drawn_after_the_crop_and_rounded_to_8_bit_levels():
    """A jitter of almost no strength gives the crop without jitter: the crop's draws come first. The result is
    8-bit levels, the same through the loaders' uint8 batches and their float ones."""
    image = np.random.default_rng(2).integers(0, 256, (23, 17, 3)).astype(np.uint8)
    tiny = (1e-9, 1e-9, 1e-9, 1e-9)
    for seed in range(10):
        plain = TrainTransform(16, (0.7, 1.6))(image, seed)
        assert torch.equal(TrainTransform(16, (0.7, 1.6), color_jitter=tiny)(image, seed), plain)
        jittered = TrainTransform(16, (0.7, 1.6), color_jitter=STRONG)(image, seed)
        as_uint8 = TrainTransform(16, (0.7, 1.6), color_jitter=STRONG, uint8=True)(image, seed)
        assert as_uint8.dtype == torch.uint8 and torch.equal(as_unit_float(as_uint8), jittered)
        assert torch.equal(to_levels(jittered), jittered * 255) and not torch.equal(jittered, plain)


def test_a_batch_jitters_each_image_as_it_would_be_jittered_alone():
    """The groups of samples by operation and place leave each image's result its own (TrainTransform jitters one
    image, the cache a batch: the same function)."""
    batch = images(16, seed=4)
    rng = np.random.default_rng(9)
    draws = [draw_jitter(rng, STRONG) if b % 5 else None for b in range(16)]
    together = color_jitter(batch, draws)
    for b, draw in enumerate(draws):
        assert torch.allclose(together[b], color_jitter(batch[b:b + 1], [draw])[0], atol=1e-7)
    assert torch.equal(together[0], batch[0])


def test_the_cache_jitters_exact_crops_exactly_as_train_transform_does():
    """Where the cache's crop equals TrainTransform's (an image at the crop's size, scale one, no flip), the jittered
    crops are equal too, for every seed's draws: the same function on the same pixels."""
    image = np.random.default_rng(3).integers(0, 256, (16, 16, 3)).astype(np.uint8)
    seeds = list(range(64))
    cached = BatchedTrainTransform(16, (1.0, 1.0), flip=False, color_jitter=STRONG)(
        [cache_image(image, 16, (1.0, 1.0), "size")] * len(seeds), [(16, 16)] * len(seeds), seeds)
    reference = torch.stack([TrainTransform(16, (1.0, 1.0), flip=False, color_jitter=STRONG)(image, s) for s in seeds])
    assert torch.equal(cached, reference)
    assert len({tuple(crop.flatten()[:20].tolist()) for crop in cached}) == len(seeds)  # each seed its own jitter


def test_the_cache_jitters_its_crops_as_train_transform_does_in_distribution():
    """At any scale the crops agree to one level (test_cache.py), which the jitter may amplify (brightness and
    contrast by up to 1.4 each, saturation by 1.8, a turn of hue by about 2): almost every pixel within one level, none
    beyond 8, and the mean image over many seeds the same."""
    size, resize_range = 16, (0.6, 1.8)
    image = np.random.default_rng(0).integers(0, 256, (20, 28, 3)).astype(np.uint8)
    seeds = list(range(200))
    cached = BatchedTrainTransform(size, resize_range, color_jitter=STRONG)(
        [cache_image(image, size, resize_range, "size")] * len(seeds), [image.shape[:2]] * len(seeds), seeds)
    reference = torch.stack([TrainTransform(size, resize_range, color_jitter=STRONG)(image, s) for s in seeds])
    plain = torch.stack([TrainTransform(size, resize_range)(image, s) for s in seeds])
    levels = ((cached - reference).abs() * 255).round()
    assert levels.max() <= 8 and (levels <= 1).float().mean() > 0.97
    assert (cached.mean(0) - reference.mean(0)).abs().max() < 0.5 / 255
    assert (cached - plain).abs().mean() > 10 / 255  # the jitter did something


def test_strengths_are_checked_by_name():
    assert check_strengths([0.4, 0, 0, 0.5]) == (0.4, 0.0, 0.0, 0.5)
    with pytest.raises(ValueError, match="hue must be at most 0.5"):
        check_strengths((0, 0, 0, 0.6))
    with pytest.raises(ValueError, match="saturation must be at least 0"):
        check_strengths((0, 0, -0.1, 0))
    with pytest.raises(ValueError, match=r"4 strengths \(brightness, contrast, saturation, hue\), got 1"):
        check_strengths((0.4,))
    with pytest.raises(ValueError, match="contrast must be at least 0"):
        TrainTransform(16, color_jitter=(0, float("nan"), 0, 0))
    with pytest.raises(ConfigError, match=r"data\.color_jitter's hue must be at most 0\.5"):
        tiny_config(data={"color_jitter": [0.4, 0.4, 0.4, 0.7]})


def test_training_with_jitter_and_the_cache_trains_and_resumes_exactly(tmp_path):
    data = {"cache": True, "color_jitter": [0.4, 0.4, 0.4, 0.1]}
    straight, resumed, _ = train_straight_and_resumed(tmp_path, steps=4, stop=2, data=data)
    assert_resumed_exactly(straight, resumed, 4)
    assert all(torch.isfinite(v).all() for k, v in straight[0].items() if k.startswith("model."))

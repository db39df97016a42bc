"""DeML's object-attention module: the random walk (eqs. 2-3), the box rule, the crop, and their guards."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from deepmetric.models.heads import deml_oam
from deepmetric.models.heads.deml_oam import (
    attention_box,
    attention_boxes,
    attention_boxes_on_device,
    components_on_device,
    compose_boxes,
    crop_and_zoom,
    dissimilarity_graph,
    largest_component,
    object_attention,
    paste,
    random_walk,
    stationary_mass,
    transition_matrix,
)


def object_on_background(size=7, patch=((2, 4), (3, 5)), channels=6, seed=0):
    """A map whose positions all share one feature, except a 2 x 2 patch with another (plus a little noise)."""
    g = torch.Generator().manual_seed(seed)
    background, foreground = torch.randn(channels, generator=g), torch.randn(channels, generator=g) + 3.0
    u = background.view(1, channels, 1, 1).repeat(1, 1, size, size)
    (r0, r1), (c0, c1) = patch
    u[:, :, r0:r1, c0:c1] = foreground.view(1, channels, 1, 1)
    return u + 0.05 * torch.randn(u.shape, generator=g)


@pytest.mark.parametrize("sigma", [0.0, 0.15])
def test_the_walk_matrix_is_column_stochastic_and_the_walk_keeps_the_mass(sigma):
    u = torch.randn(3, 5, 4, 6, generator=torch.Generator().manual_seed(1))
    weights = dissimilarity_graph(u, sigma)
    assert weights.shape == (3, 24, 24) and (weights >= 0).all()
    assert torch.allclose(weights, weights.transpose(1, 2), atol=1e-5)
    assert torch.all(weights.diagonal(dim1=1, dim2=2) == 0)
    p = transition_matrix(weights)
    assert torch.allclose(p.sum(dim=1), torch.ones(3, 24), atol=1e-6)  # columns: P[a, b] = P(b -> a)
    assert not torch.allclose(p.sum(dim=2), torch.ones(3, 24), atol=1e-3)  # rows do not (not the literal reading)
    mass = random_walk(p, steps=10)
    assert (mass >= 0).all() and torch.allclose(mass.sum(dim=1), torch.ones(3), atol=1e-6)


def test_edge_weights_match_a_slow_loop_over_pairs_of_locations():
    """Eq. 2's D[a, b] = ||u_a - u_b|| between locations a = (i, j) and b = (k, l), times the code's Gaussian
    exp(-((i - k)^2 + (j - l)^2) / (2 s^2)), s = spatial_sigma x max(h, w), on a non-square map."""
    u = torch.randn(1, 3, 3, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    plain, spatial = dissimilarity_graph(u)[0], dissimilarity_graph(u, 0.3)[0]
    s = 0.3 * 5
    for a in range(15):
        for b in range(15):
            (i, j), (k, l) = divmod(a, 5), divmod(b, 5)
            distance = float((u[0, :, i, j] - u[0, :, k, l]).norm())
            assert float(plain[a, b]) == pytest.approx(distance, abs=1e-5)
            gaussian = math.exp(-((i - k) ** 2 + (j - l) ** 2) / (2 * s**2))
            assert float(spatial[a, b]) == pytest.approx(distance * gaussian, abs=1e-5)


def test_the_map_peaks_on_a_distinct_region_where_the_literal_row_normalised_walk_stays_flat():
    u = object_on_background()
    ours = stationary_mass(u, steps=10)[0]  # (7, 7)
    assert ours.max() > 3 * ours.min()  # not flat
    peak = divmod(int(ours.argmax()), 7)
    assert 2 <= peak[0] < 4 and 3 <= peak[1] < 5  # on the object
    assert ours[2:4, 3:5].min() > ours.flatten()[ours.flatten() < ours.max() / 2].max()  # the whole patch leads
    # The paper's text read literally: out-bound (row) normalisation and M <- D M from the uniform start.
    d = dissimilarity_graph(u)[0]
    literal = d / d.sum(dim=1, keepdim=True)
    m = torch.full((49, 1), 1 / 49)
    for _ in range(10):
        m = literal @ m
    assert torch.allclose(m, torch.full((49, 1), 1 / 49), atol=1e-7)  # flat, whatever the image
    assert not torch.allclose(ours.flatten(), m.flatten(), atol=1e-3)  # ... which is not what we compute


def test_the_walk_converges_to_the_weighted_degree():
    u = torch.randn(2, 4, 5, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weights = dissimilarity_graph(u, 0.15).double()
    degree = weights.sum(dim=2) / weights.sum(dim=(1, 2)).unsqueeze(1)  # pi_a ∝ sum_b D[a, b]
    p = transition_matrix(weights)
    assert torch.allclose(random_walk(p, 200), degree, atol=1e-10)
    assert torch.allclose(random_walk(p, 10), degree, rtol=0.05, atol=0)  # T = 10: within 5%


def test_the_map_is_invariant_to_feature_scale_and_offset_and_equivariant_to_flips():
    u = torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    base = stationary_mass(u)
    assert torch.allclose(stationary_mass(3.0 * u + 2.0), base, atol=1e-8)
    permutation = torch.randperm(36, generator=torch.Generator().manual_seed(0))
    shuffled = u.flatten(2)[:, :, permutation].view_as(u)  # without the spatial kernel positions are exchangeable
    assert torch.allclose(stationary_mass(shuffled).flatten(1), base.flatten(1)[:, permutation], atol=1e-8)
    kernel = stationary_mass(u, spatial_sigma=0.15)
    assert torch.allclose(stationary_mass(u.flip(3), spatial_sigma=0.15), kernel.flip(2), atol=1e-8)
    assert torch.allclose(stationary_mass(u.transpose(2, 3), spatial_sigma=0.15), kernel.transpose(1, 2), atol=1e-8)


def test_identical_features_give_a_uniform_map_and_the_whole_image():
    u = torch.ones(2, 8, 5, 5)
    mass = stationary_mass(u, spatial_sigma=0.15)
    assert torch.isfinite(mass).all() and torch.allclose(mass, torch.full_like(mass, 1 / 25))
    attention = object_attention([u, torch.zeros(2, 3, 3, 3)], size=(32, 32))
    assert torch.isfinite(attention).all()
    assert attention_box(attention[0].numpy()) == (0, 0, 32, 32)
    images = torch.rand(2, 3, 32, 32)
    whole = torch.tensor([[0.0, 0, 32, 32]] * 2)
    assert torch.allclose(crop_and_zoom(images, whole), images, atol=1e-6)


def random_blobs(rng, height, width):
    """A smooth map with a few bumps, some of them touching the border."""
    ys, xs = np.mgrid[0:height, 0:width]
    total = np.zeros((height, width))
    for _ in range(rng.integers(1, 4)):
        cy, cx = rng.uniform(-0.1, 1.1) * height, rng.uniform(-0.1, 1.1) * width
        sy, sx = rng.uniform(0.05, 0.4) * height, rng.uniform(0.05, 0.4) * width
        total += rng.uniform(0.5, 2) * np.exp(-((ys - cy) ** 2 / (2 * sy**2) + (xs - cx) ** 2 / (2 * sx**2)))
    return total


def test_the_box_is_square_inside_and_holds_the_largest_component_about_its_centre():
    rng = np.random.default_rng(0)
    for _ in range(60):
        size = int(rng.integers(8, 48))
        attention = random_blobs(rng, size, size)
        x0, y0, x1, y1 = attention_box(attention)
        assert x1 - x0 == y1 - y0 > 0  # square
        assert 0 <= x0 and 0 <= y0 and x1 <= size and y1 <= size  # inside
        component = largest_component(attention > attention.mean())
        ys, xs = np.nonzero(component)
        assert x0 <= xs.min() and xs.max() < x1 and y0 <= ys.min() and ys.max() < y1  # holds it
        bx0, bx1, by0, by1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
        if 0 < x0 and x1 < size:  # not shifted at the border: centred on the component's box
            assert abs((x0 + x1) - (bx0 + bx1)) <= 1
        if 0 < y0 and y1 < size:
            assert abs((y0 + y1) - (by0 + by1)) <= 1
        assert x1 - x0 == max(bx1 - bx0, by1 - by0)


def test_the_largest_component_is_chosen():
    mask = np.zeros((10, 10), dtype=bool)
    mask[0:2, 0:2] = True  # 4 pixels
    mask[5:8, 4:9] = True  # 15 pixels
    assert largest_component(mask).sum() == 15 and largest_component(mask)[6, 6]
    attention = np.where(mask, 1.0, 0.0)
    assert attention_box(attention) == (4, 4, 9, 9)  # 5 x 3 component -> 5 x 5 square, same centre


def test_crop_and_zoom_samples_the_box_without_gradient():
    images = torch.rand(2, 3, 16, 16, requires_grad=True)
    boxes = torch.tensor([[4.0, 2.0, 12.0, 10.0], [0.0, 8.0, 8.0, 16.0]])
    crops = crop_and_zoom(images, boxes)
    assert crops.shape == images.shape and not crops.requires_grad
    for crop, image, (x0, y0, x1, y1) in zip(crops, images.detach(), boxes.int().tolist(), strict=True):
        reference = F.interpolate(image[None, :, y0:y1, x0:x1], size=(16, 16), mode="bilinear", align_corners=False)
        assert torch.allclose(crop[:, 1:-1, 1:-1], reference[0, :, 1:-1, 1:-1], atol=1e-5)  # border pixels may
        # differ: the crop reads the image around the box, interpolate clamps to the box


def test_composed_regions_and_pasted_maps_land_where_the_crops_came_from():
    outer = torch.tensor([[8.0, 0.0, 24.0, 16.0]])
    inner = torch.tensor([[16.0, 16.0, 32.0, 32.0]])  # the lower-right quarter of the 32 x 32 crop
    assert torch.equal(compose_boxes(outer, inner, (32, 32)), torch.tensor([[16.0, 8.0, 24.0, 16.0]]))
    inner = torch.tensor([[4.0, 8.0, 12.0, 16.0]])  # a box whose right and bottom differ: x1 is read for x, y1 for y
    assert torch.equal(compose_boxes(outer, inner, (32, 32)), torch.tensor([[10.0, 4.0, 14.0, 8.0]]))
    pasted = paste(torch.ones(1, 32, 32), torch.tensor([[16.0, 8.0, 24.0, 16.0]]))[0]
    assert torch.allclose(pasted[8:16, 16:24], torch.ones(8, 8))
    pasted[8:16, 16:24] = 0
    assert pasted.abs().max() <= 0.5  # only the box's one-pixel rim is blended
    assert pasted[:7].abs().max() == 0 and pasted[:, :15].abs().max() == 0


# ---- the boxes found on the device (a GPU's path), against SciPy's on the host ---------------------------------
def scipy_labels_by_first_pixel(mask: np.ndarray) -> np.ndarray:
    """``components_on_device``'s answer from SciPy: each pixel of the mask labelled by the raster index of its
    8-connected component's first pixel, H·W off the mask."""
    from scipy import ndimage

    labels, count = ndimage.label(mask, structure=np.ones((3, 3), dtype=int))
    flat = labels.ravel()
    first = {int(label): int(np.argmax(flat == label)) for label in range(1, count + 1)}
    return np.array([first[int(v)] if v else mask.size for v in flat]).reshape(mask.shape)


def spiral(size: int) -> np.ndarray:
    """One long 8-connected path winding inwards from the top-left corner (its far end is far from its first
    pixel: what plain label propagation needs many steps for)."""
    mask, (y, x), (dy, dx) = np.zeros((size, size), dtype=bool), (0, 0), (0, 1)
    for _ in range(4 * size * size):
        mask[y, x] = True
        ahead, beyond = (y + dy, x + dx), (y + 2 * dy, x + 2 * dx)
        inside = all(0 <= v < size for v in ahead)
        if not inside or (all(0 <= v < size for v in beyond) and mask[beyond]):
            dy, dx = dx, -dy
            ahead, beyond = (y + dy, x + dx), (y + 2 * dy, x + 2 * dx)
            if not all(0 <= v < size for v in ahead) or mask[ahead] or (
                    all(0 <= v < size for v in beyond) and mask[beyond]):
                break
        y, x = ahead
    return mask


def test_the_components_found_on_the_device_are_scipys_labelled_by_their_first_pixel():
    rng = np.random.default_rng(0)
    masks = [rng.random((int(rng.integers(1, 30)), int(rng.integers(1, 30)))) < rng.uniform(0.2, 0.8)
             for _ in range(80)]
    masks += [spiral(23), spiral(23)[::-1], spiral(23).T[:, ::-1], np.ones((9, 40), dtype=bool),
              np.zeros((5, 5), dtype=bool), np.eye(12, dtype=bool)[::-1]]  # one anti-diagonal: 8-connected
    for mask in masks:
        found = components_on_device(torch.from_numpy(np.ascontiguousarray(mask))[None])[0].numpy()
        np.testing.assert_array_equal(found, scipy_labels_by_first_pixel(mask))
    batch = np.stack([spiral(15), np.ones((15, 15), dtype=bool), rng.random((15, 15)) < 0.5])
    found = components_on_device(torch.from_numpy(batch)).numpy()
    for mask, labels in zip(batch, found, strict=True):  # maps of a batch do not mix
        np.testing.assert_array_equal(labels, scipy_labels_by_first_pixel(mask))


def test_the_propagation_stops_only_when_nothing_changes(monkeypatch):
    """With a check after every step, the spiral (one component of 300 pixels) still ends with one label; the
    hooking is what keeps its steps few (plain propagation needs one step per pixel of the path)."""
    steps = []
    original = F.max_pool2d
    monkeypatch.setattr(deml_oam, "PROPAGATION_CHECK", 1)
    monkeypatch.setattr(deml_oam.F, "max_pool2d", lambda *a, **k: steps.append(1) or original(*a, **k))
    mask = spiral(25)
    labels = components_on_device(torch.from_numpy(mask)[None])[0].numpy()
    assert set(labels[mask].tolist()) == {0} and mask.sum() > 300
    assert len(steps) < 40


def test_the_boxes_found_on_the_device_are_attention_box_s():
    """Smooth maps (DeML's kind), noisy ones with many equally large components (the first in raster order is
    kept), flat maps, non-square and one-pixel maps."""
    rng = np.random.default_rng(1)
    maps = [random_blobs(rng, int(rng.integers(2, 40)), int(rng.integers(2, 40))) for _ in range(60)]
    maps += [(rng.random((int(rng.integers(2, 30)), int(rng.integers(2, 30)))) < 0.5).astype(float)
             for _ in range(60)]
    ties = np.zeros((10, 10))
    ties[1:3, 6:8] = ties[6:8, 1:3] = 1.0  # two 2 x 2 components: the upper one is first in raster order
    maps += [ties, ties.T, np.full((6, 9), 3.0), 1000.0 + 1e-5 * rng.random((6, 6)), np.ones((1, 1)),
             np.arange(12.0).reshape(3, 4), 1e-13 + 2e-13 * ties, 1e-13 + 1e-20 * rng.random((6, 6))]  # below 1e-12
    at_the_mean = np.zeros((10, 10))
    at_the_mean[:5, :5], at_the_mean[:5, 5:], at_the_mean[5:, :5] = 2.0, 1.0, 1.0  # mean exactly 1: the 1s not above
    corner = np.zeros((6, 6))
    corner[0, 0] = 1.0  # a one-pixel component in the first row and column
    faint = 1e-13 + 5e-19 * rng.random((6, 6))  # below FLAT x 1e-12: flat, however small the map
    maps += [at_the_mean, corner, faint]
    assert attention_box(at_the_mean.astype(np.float32)) == (0, 0, 5, 5)
    assert attention_box(corner.astype(np.float32)) == (0, 0, 1, 1)
    assert attention_box(faint.astype(np.float32)) == (0, 0, 6, 6)
    for attention in maps:
        attention = attention.astype(np.float32)
        found = attention_boxes_on_device(torch.from_numpy(attention)[None])
        assert found.dtype == torch.float32
        assert found[0].tolist() == [float(v) for v in attention_box(attention)], attention.shape  # whole pixels
    bump = np.zeros((6, 6))
    bump[1:3, 1:3] = 1.0
    mixed = np.stack([1000.0 + 5e-4 * bump, 2000 * rng.random((6, 6)), corner])  # apart in scale; the first flat
    mixed = mixed.astype(np.float32)
    expected = [list(attention_box(m)) for m in mixed]
    assert expected[0] == [0, 0, 6, 6]
    assert attention_boxes_on_device(torch.from_numpy(mixed)).int().tolist() == expected
    batch = np.stack([random_blobs(rng, 24, 20) for _ in range(8)] + [rng.random((24, 20)) for _ in range(8)])
    batch = torch.from_numpy(batch.astype(np.float32))
    assert torch.equal(attention_boxes_on_device(batch), attention_boxes(batch))  # a batch, against SciPy's
    assert attention_boxes_on_device(batch).int().tolist() == [list(attention_box(m)) for m in batch.numpy()]


def test_attention_boxes_uses_scipy_on_the_cpu_and_the_device_path_elsewhere(monkeypatch):
    calls = []
    monkeypatch.setattr(deml_oam, "attention_boxes_on_device", lambda maps: calls.append(maps.device.type))
    attention_boxes(torch.rand(2, 8, 8))
    assert calls == []
    attention_boxes(torch.rand(2, 8, 8, device="meta"))
    assert calls == ["meta"]

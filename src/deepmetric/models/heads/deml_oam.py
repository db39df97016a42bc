"""DeML's object-attention module (OAM, Chen & Deng, CVPR 2019, §3.1, eqs. 2-3): a parameter-free random walk
over the positions of a feature map, and the crop it proposes.

1. Graph (eq. 2): one node per position a = h·W + w of a map U (C x h x w), edge weight
   ``D[a, b] = ||u_a - u_b||_2``; optionally times the Gaussian spatial kernel of the authors' code,
   ``exp(-((row_a - row_b)^2 + (col_a - col_b)^2) / (2 sigma^2))``, sigma = 0.15 x the map side.
2. Walk (eq. 3): ``M <- P M`` for T = 10 steps from the uniform ``M = 1/(hw)``, with P the **column**-normalised
   D, ``P[a, b] = D[a, b] / sum_a' D[a', b]`` (the probability of moving from b to a). P is column-stochastic, so
   the total mass stays 1 and the walk settles at ``pi_a ∝ sum_b D[a, b]``: mass gathers on positions that
   differ from the rest of the map. The paper's text normalises the *out*-bound edges (rows) and then
   applies ``M <- D M``; read literally that keeps the uniform start fixed (D 1 = 1), a flat map whatever the
   image. The released code normalises columns, as here (a test shows the difference).
3. Map: each source layer's M reshaped to h x w, min-max normalised (as the code does before resizing),
   resized bilinearly to the image and averaged over layers (the paper averages 4e and 5b; the code uses 5b).
4. Box (the code's rule, made to contain the object): threshold the map at its mean, keep the largest
   8-connected component, take the square of side max(w, h) of its bounding box about the same centre,
   shifted (not clipped) into the image, so it stays square and still contains the component. The code
   uses side (w + h)/2 and clips at the border, which can cut an elongated object.
5. Crop: the box of the image, resized bilinearly to the image size (no gradient flows through it).

Degenerate input (all features equal, so D = 0) gives the uniform map and the full-image box, never NaN.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

FLAT = 1e-6  # a map whose (max - min) is below FLAT x max is treated as flat (no object found)


def dissimilarity_graph(features: torch.Tensor, spatial_sigma: float = 0.0) -> torch.Tensor:
    """Edge weights of eq. 2 for a batch of maps (B, C, h, w): (B, hw, hw), symmetric, zero diagonal.

    ``spatial_sigma`` > 0 multiplies by the code's Gaussian kernel with sigma = spatial_sigma x max(h, w).
    """
    b, c, h, w = features.shape
    nodes = features.float().flatten(2).transpose(1, 2)  # (B, hw, C)
    weights = torch.cdist(nodes, nodes, compute_mode="donot_use_mm_for_euclid_dist")
    if spatial_sigma > 0:
        rows, cols = torch.meshgrid(torch.arange(h, device=features.device), torch.arange(w, device=features.device),
                                    indexing="ij")
        grid = torch.stack([rows.flatten(), cols.flatten()], dim=1).float()  # (hw, 2)
        sigma = spatial_sigma * max(h, w)
        weights = weights * torch.exp(-torch.cdist(grid, grid).pow(2) / (2 * sigma**2))
    return weights


def transition_matrix(weights: torch.Tensor) -> torch.Tensor:
    """Column-stochastic ``P[a, b] = D[a, b] / sum_a' D[a', b]`` (B, N, N). A column with no weight (its node
    equals every other) becomes uniform, so P stays column-stochastic and degenerate maps stay flat."""
    totals = weights.sum(dim=1, keepdim=True)  # (B, 1, N): column sums
    uniform = torch.full_like(weights, 1.0 / weights.shape[1])
    return torch.where(totals > 0, weights / totals.clamp_min(torch.finfo(weights.dtype).tiny), uniform)


def random_walk(transition: torch.Tensor, steps: int = 10) -> torch.Tensor:
    """Eq. 3, ``M <- (prod_{t=1}^T P) M`` from the uniform start: (B, N) masses summing to 1."""
    b, n, _ = transition.shape
    mass = torch.full((b, n, 1), 1.0 / n, dtype=transition.dtype, device=transition.device)
    for _ in range(steps):
        mass = transition @ mass
    return mass.squeeze(2)


def stationary_mass(features: torch.Tensor, steps: int = 10, spatial_sigma: float = 0.0) -> torch.Tensor:
    """The object-attention proposal M of one layer (eqs. 2-3): (B, h, w), each map summing to 1."""
    b, _, h, w = features.shape
    return random_walk(transition_matrix(dissimilarity_graph(features, spatial_sigma)), steps).view(b, h, w)


def _min_max(maps: torch.Tensor) -> torch.Tensor:
    """Per map to [0, 1]; a flat map becomes 0."""
    low = maps.flatten(1).amin(dim=1).view(-1, 1, 1)
    span = maps.flatten(1).amax(dim=1).view(-1, 1, 1) - low
    flat = span <= FLAT * (low + span).abs().clamp_min(torch.finfo(maps.dtype).tiny)
    return torch.where(flat, torch.zeros_like(maps), (maps - low) / span.clamp_min(torch.finfo(maps.dtype).tiny))


@torch.no_grad()
def object_attention(layers: list[torch.Tensor], size: tuple[int, int], steps: int = 10,
                     spatial_sigma: float = 0.0) -> torch.Tensor:
    """The OAM map of an image from its source layers [(B, C_k, h_k, w_k)]: each layer's stationary mass,
    min-max normalised, resized to ``size`` and averaged over layers: (B, H, W) in [0, 1]."""
    maps = [F.interpolate(_min_max(stationary_mass(u.detach(), steps, spatial_sigma)).unsqueeze(1), size=size,
                          mode="bilinear", align_corners=False) for u in layers]
    return torch.stack(maps).mean(dim=0).squeeze(1)


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 8-connected component of a boolean (H, W) mask (empty if the mask is)."""
    labels, count = ndimage.label(mask, structure=np.ones((3, 3), dtype=int))
    if count == 0:
        return np.zeros_like(mask)
    sizes = np.bincount(labels.ravel())[1:]
    return labels == (1 + int(sizes.argmax()))


def is_flat(maps: torch.Tensor) -> torch.Tensor:
    """(B,) bool: maps (B, H, W) whose range is at most ``FLAT`` x their magnitude (floored at 1e-12), in float64:
    no object found there."""
    peak, low = maps.flatten(1).amax(dim=1).double(), maps.flatten(1).amin(dim=1).double()
    return peak - low <= FLAT * torch.maximum(torch.maximum(peak.abs(), low.abs()), torch.full_like(peak, 1e-12))


def square_boxes(component: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Step 4's box around each map's largest component (B, H, W) bool: (B, 4) float32 ``(x0, y0, x1, y1)`` (pixels,
    end exclusive), the square of side max(w, h) of the component's bounding box about its centre, shifted (not
    clipped) into the image; the whole image where the map is ``flat`` or the component empty."""
    b, h, w = component.shape
    rows, columns = component.any(dim=2), component.any(dim=1)  # (B, H), (B, W)
    empty = ~rows.any(dim=1) | flat

    def span(present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(present.shape[1], device=present.device)
        first = torch.where(present, positions, present.shape[1]).amin(dim=1)
        last = torch.where(present, positions, -1).amax(dim=1)
        return first, last + 1

    (y0, y1), (x0, x1) = span(rows), span(columns)
    side = torch.clamp(torch.maximum(x1 - x0, y1 - y0), max=min(w, h))

    def square_about(low: torch.Tensor, high: torch.Tensor, limit: int) -> torch.Tensor:
        """Start of the interval of length ``side`` centred on [low, high), shifted into [0, limit)."""
        start = torch.div(low + high - side, 2, rounding_mode="floor")
        return torch.minimum(torch.clamp(start, min=0), limit - side)

    left, top = square_about(x0, x1, w), square_about(y0, y1, h)
    boxes = torch.stack([left, top, left + side, top + side], dim=1)
    whole = torch.tensor([0, 0, w, h], device=component.device)
    return torch.where(empty[:, None], whole, boxes).float()


def scipy_components(maps: np.ndarray) -> np.ndarray:
    """(B, H, W) bool: each map's largest component above its mean (float64), found by SciPy on the host."""
    return np.stack([largest_component(m > m.mean(dtype=np.float64)) for m in maps])


def attention_box(attention: np.ndarray) -> tuple[int, int, int, int]:
    """Box ``(x0, y0, x1, y1)`` (pixels, end exclusive) of one map (H, W): square about the centre of the largest
    component above the map's mean, side max(w, h), inside the image; the whole image for a flat map."""
    maps = np.asarray(attention)[None]
    box = square_boxes(torch.from_numpy(scipy_components(maps)), is_flat(torch.from_numpy(maps)))[0]
    x0, y0, x1, y1 = (int(v) for v in box.tolist())
    return x0, y0, x1, y1


PROPAGATION_CHECK = 4
"""Steps of ``components_on_device``'s label propagation between two checks for its end (each check waits for the
device once)."""


def components_on_device(mask: torch.Tensor) -> torch.Tensor:
    """The 8-connected components of boolean masks (B, H, W), on their device: (B, H, W) int64 holding, at each pixel
    of the mask, the raster index ``h·W + w`` of its component's first pixel in raster order, and ``H·W`` off the
    mask: the order in which SciPy's ``ndimage.label`` numbers them.

    Each pixel's label starts as its own index and is always the index of a pixel of its component (the pixel it
    points to). A step finds the least label of each pixel's 3 x 3 neighbourhood within the mask and gives it to
    the pixel and to the pixel it points to (hooking: a wave reaching one pixel of a branch reaches the pixel the
    whole branch points to), then each pixel takes the label of the pixel it points to (pointer jumping). Labels
    only fall, and stop when every pixel of a component holds the same one, which is then its first pixel's index
    (that pixel can hold no less). The steps grow about as the logarithm of a component's length, not as its
    length (a 224 x 224 map of DeML's: from about 100 steps to 10)."""
    b, h, w = mask.shape
    off = h * w
    dtype = torch.float32 if off < 2**24 else torch.float64  # integers exact, and max-pooling defined, in floats
    index = torch.arange(off, device=mask.device, dtype=dtype).view(1, h, w).expand(b, h, w)
    labels = torch.where(mask, index, torch.tensor(float(off), device=mask.device, dtype=dtype)).flatten(1)
    labels = torch.cat([labels, torch.full((b, 1), float(off), device=mask.device, dtype=dtype)], dim=1)
    inside = torch.cat([mask.flatten(1), torch.zeros(b, 1, dtype=torch.bool, device=mask.device)], dim=1)
    while True:
        before = labels
        for _ in range(PROPAGATION_CHECK):
            grid = labels[:, :off].view(b, 1, h, w)
            least = -F.max_pool2d(-grid, 3, stride=1, padding=1).flatten(1)  # (B, H·W)
            least = torch.cat([least, labels[:, off:]], dim=1).where(inside, labels)  # off the mask: unchanged
            pointer = labels.long()
            labels = torch.minimum(labels, least).scatter_reduce(1, pointer, least, reduce="amin")
            labels = labels.gather(1, labels.long())
        if torch.equal(labels, before):
            return labels[:, :off].long().view(b, h, w)


def largest_components_on_device(above: torch.Tensor) -> torch.Tensor:
    """``scipy_components`` of masks (B, H, W) on their device: the largest component of ``components_on_device``,
    the first in raster order among equally large ones (as SciPy's labels and ``argmax`` choose)."""
    b, h, w = above.shape
    labels = components_on_device(above).flatten(1)  # (B, H·W), H·W off the mask
    sizes = torch.zeros(b, h * w + 1, dtype=torch.int64, device=above.device)
    sizes.scatter_add_(1, labels, torch.ones_like(labels))
    largest = sizes[:, :-1].argmax(dim=1, keepdim=True)  # the first of the largest: the least first pixel
    return (labels == largest).view(b, h, w) & above


def attention_boxes_on_device(attention: torch.Tensor) -> torch.Tensor:
    """``attention_box`` of every map of a batch (B, H, W) computed on the maps' device, without copying them to
    the host: (B, 4) float32. The same boxes as ``attention_box`` (tested): the map's mean in float64, the largest
    component found by ``largest_components_on_device``, and the same ``square_boxes``."""
    maps = attention.detach().float()
    precise = maps.double()
    return square_boxes(largest_components_on_device(precise > precise.mean(dim=(1, 2), keepdim=True)), is_flat(maps))


@torch.compiler.disable
def attention_boxes(attention: torch.Tensor) -> torch.Tensor:
    """``attention_box`` of every map of a batch (B, H, W): (B, 4) float boxes on the maps' device. On a GPU they
    are found there (``attention_boxes_on_device``: an H200 spent 68 ms a batch of 64 maps of 224 x 224 copying them
    to the host and labelling them with SciPy while it waited, 2026-11-28); on the CPU by SciPy, faster there.

    Left out of a compiled graph (``train.compile``): traced, dynamo guarded on the maps' values read on the host
    and compiled again at every step until its recompile limit (an H100, 2026-11-27)."""
    if attention.device.type != "cpu":
        return attention_boxes_on_device(attention)
    maps = attention.detach().float()
    return square_boxes(torch.from_numpy(scipy_components(maps.numpy())), is_flat(maps))


def _affine(boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``affine_grid`` parameters that sample the region ``boxes`` (B, 4) of an image of ``size`` (align_corners
    False: output pixel k of n samples x0 + (k + 0.5)(x1 - x0)/n, the region's pixel grid)."""
    height, width = size
    x0, y0, x1, y1 = boxes.unbind(dim=1)
    theta = boxes.new_zeros(len(boxes), 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = (x1 - x0) / width, (x0 + x1) / width - 1
    theta[:, 1, 1], theta[:, 1, 2] = (y1 - y0) / height, (y0 + y1) / height - 1
    return theta


@torch.no_grad()
def crop_and_zoom(images: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """The region ``boxes`` (B, 4) of each image (B, C, H, W), resized bilinearly to H x W; no gradient.

    Applied to the normalised image this equals normalising the crop of the raw image (normalisation is a
    per-channel affine map and bilinear weights sum to 1)."""
    size = (images.shape[-2], images.shape[-1])
    grid = F.affine_grid(_affine(boxes.to(images.dtype), size), list(images.shape), align_corners=False)
    return F.grid_sample(images.detach(), grid, mode="bilinear", padding_mode="border", align_corners=False)


def compose_boxes(outer: torch.Tensor, inner: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """A box ``inner`` given in the frame of the crop ``outer`` (both (B, 4)), expressed in the outer image's frame."""
    height, width = size
    sx, sy = (outer[:, 2] - outer[:, 0]) / width, (outer[:, 3] - outer[:, 1]) / height
    return torch.stack([outer[:, 0] + inner[:, 0] * sx, outer[:, 1] + inner[:, 1] * sy,
                        outer[:, 0] + inner[:, 2] * sx, outer[:, 1] + inner[:, 3] * sy], dim=1)


@torch.no_grad()
def paste(maps: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Maps (B, H, W) of crops, placed back at their ``boxes`` (B, 4) of the original image (zero elsewhere)."""
    height, width = maps.shape[-2:]
    x0, y0, x1, y1 = boxes.to(maps.dtype).unbind(dim=1)
    theta = boxes.new_zeros(len(boxes), 2, 3).to(maps.dtype)
    theta[:, 0, 0], theta[:, 0, 2] = width / (x1 - x0), (width - 2 * x0) / (x1 - x0) - 1
    theta[:, 1, 1], theta[:, 1, 2] = height / (y1 - y0), (height - 2 * y0) / (y1 - y0) - 1
    grid = F.affine_grid(theta, [len(maps), 1, height, width], align_corners=False)
    return F.grid_sample(maps.unsqueeze(1), grid, mode="bilinear", padding_mode="zeros",
                         align_corners=False).squeeze(1)

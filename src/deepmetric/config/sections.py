"""The run configuration's sections: every knob of a run in one typed tree, with its default and meaning."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

LR_SCHEDULES = ("constant", "cosine", "step")
"""``train.lr_schedule`` choices (training/optim.py)."""
AMP_MODES = ("fp16", "bf16")
"""``train.amp`` choices besides ``false`` (training/precision.py); ``true`` is read as ``bf16``."""


@dataclass
class DataConfig:
    """Data set, sampler and augmentation."""

    spec: str = "glyphs"
    """Loader spec: ``glyphs``, ``fashion-mnist``, ``digits``, ``folder:PATH``, ``csv:PATH``,
    ``cub:PATH``, ``cars:PATH``, ``sop:PATH``, ``inshop:PATH``, or ``cub-cropped:PATH`` / ``cars-cropped:PATH``
    (each image cut to its bounding box)."""
    image_size: int = 224
    """Side of the square training crop and of the test image."""
    resize_range: tuple[float, float] = (0.8, 1.8)
    """Multi-resolution augmentation: the longer side is resized to U[lo, hi] x image_size."""
    flip: bool = True
    """Random horizontal flip at training time (turn off for characters: b/d)."""
    color_jitter: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """Colour jitter of the training crop, torchvision's ``ColorJitter(brightness, contrast, saturation, hue)``: each
    of the first three factors drawn from ``U[max(0, 1 - x), 1 + x]``, the hue's from ``U[-x, x]`` (at most 0.5),
    applied in a random order and rounded back to 8-bit levels (``deepmetric.data.color_jitter``); the same with
    ``data.cache``, there on the training device. Off (all zero) by default, as in every paper of the project; a
    common choice elsewhere is ``[0.4, 0.4, 0.4, 0.1]``, which lowered emoji's test R@1 by 1.3 points (a turn of hue
    confuses the emoji that differ only by colour) and changed nothing without the hue or on icons
    (docs/studies/color-jitter.md)."""
    train_pad: str = "size"
    """Before the random crop, pad the resized image to image_size (``size``, the thesis and the HORDE code)
    or its shorter side to the longer one (``square``, ABE), or resize both sides to the drawn length without
    keeping the aspect ratio (``stretch``, ABE's cropped Cars-196)."""
    test_resize: str = "resize"
    """``resize`` (squash to image_size, the thesis), ``resize_crop`` (resize to 1.144x, centre crop,
    the HORDE authors' code), ``pad_crop`` (longer side to 256/224 x keeping the aspect ratio, pad to a
    square, centre crop: ABE), ``stretch_crop`` (both sides to 256/224 x, centre crop: ABE's cropped
    Cars-196) or ``short_crop`` (shorter side to 256/224 x keeping the aspect ratio, centre crop: torchvision's
    Resize(256) + CenterCrop(224), the DGML code)."""
    classes_per_batch: int = 5
    """P of the P x K batch."""
    samples_per_class: int = 8
    """K of the P x K batch."""
    val_fraction: float = 0.0
    """Fraction of the training classes held out (class-disjoint) for model selection."""
    val_seed: int = 0
    check_counts: bool = True
    """Fail when a benchmark's split sizes differ from the published ones."""
    check_images: bool = True
    """Decode every image before training and stop with the list of bad ones (see ``skip_bad_images``)."""
    skip_bad_images: bool = False
    """Leave bad images (and classes left with one image) out instead of stopping; the list goes to the run."""
    num_workers: int | None = None
    """DataLoader worker processes decoding and augmenting images. None (the default): none on the CPU, and on a
    GPU as many as keep it fed (``deepmetric.data.torch_dataset.loader_workers``: 12 where there are CPUs for
    them)."""
    pin_memory: bool | None = None
    """Page-locked batches, whose copy to the GPU overlaps the step. None (the default): on a GPU only."""
    cache: bool = False
    """Decode the training images once and augment each batch on the training device (``deepmetric.data.cache``):
    the images are kept as uint8, on the GPU when they take at most half its free memory, else in memory (refused,
    before decoding, when they would not fit), each no larger than the augmentation can use (longer side
    ``ceil(resize_range[1] x image_size)``: what lets a batch be one tensor); the resize, padding, crop and flip then
    run as batched tensor operations with the same draws from the same seeds as without it. The crops equal the
    uncached ones to one level of 255 for images within that size, and are slightly softer (resized twice) for
    larger ones (``deepmetric.data.batched_transforms``), and the colour jitter is the same function on the same
    draws. No DataLoader workers are used."""
    seed: int = 0
    """Seed of the data set itself where it has one (the glyphs character split)."""


@dataclass
class ModelConfig:
    """Backbone and head (see ``deepmetric.create_model``)."""

    backbone: str = "lite0"
    pretrained: bool = True
    weights: str | None = None
    """Optional safetensors file of backbone weights (e.g. a converted Caffe GoogLeNet or BN-Inception)."""
    trust_pickle: bool = False
    """Allow ``weights`` to be a legacy pickled torch file (read with torch's restricted unpickler)."""
    split: str | None = None
    """Where the backbone is cut into trunk and tail; None lets the head choose."""
    freeze_bn: bool | str = True
    """BatchNorm in the backbone: true freezes its statistics and affine parameters (timm's FrozenBatchNorm2d),
    ``stats`` its statistics only (the affine weight and bias train: the DGML code's ResNet-50), false neither."""
    head: str = "gap"
    embedding_dim: int = 512
    head_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class MemoryConfig:
    """A cross-batch memory (XBM, Wang et al. CVPR 2020; ``deepmetric.losses.memory``): a FIFO queue of the last
    ``size`` embeddings and labels; from step ``warmup_steps`` on, the loss adds ``weight`` x the metric loss between
    the batch (queries) and the memory (references). Off while ``size`` is 0."""

    size: int = 0
    """Rows held (0: no memory); at least one batch, ``data.classes_per_batch x data.samples_per_class``."""
    warmup_steps: int = 1000
    """Steps before the memory starts (nothing enqueued, no term): the paper's 1,000 on SOP; below ``train.steps``."""
    weight: float = 1.0
    """Weight of the memory term (the paper's 1)."""


@dataclass
class LossConfig:
    """The objective: a metric loss (see ``deepmetric.losses``) plus regularisers."""

    name: str = "binomial"
    options: dict[str, Any] = field(default_factory=dict)
    on: str | None = None
    """``embedding`` (one loss on the concatenated embedding) or ``parts`` (one per learner); None: the head's
    default."""
    parts_reduction: str | None = None
    """``mean`` or ``sum`` of the per-part losses; None: the head's default."""
    regularizers: dict[str, dict[str, Any]] | None = None
    """``{name: {weight: w, option: value}}``; None: the head's default regularisers, ``{}``: none."""
    miner: str | None = None
    """A pair/triplet miner for a pytorch-metric-learning loss, ``pml:<Class>`` (e.g. ``pml:MultiSimilarityMiner``)."""
    miner_options: dict[str, Any] = field(default_factory=dict)
    """The miner's keyword options."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """A cross-batch memory (``loss.memory.size``, ``warmup_steps``, ``weight``); off by default."""


@dataclass
class TrainConfig:
    """Optimisation and checkpoints."""

    steps: int = 1000
    lr: float = 1e-5
    """Learning rate of the new layers (head)."""
    lr_backbone: float = 1e-5
    """Learning rate of the pretrained layers."""
    lr_loss: float | None = None
    """Learning rate of parameters that live in the loss (margin's beta, a PML loss's proxies); None means ``lr``, or
    100 x ``lr_backbone`` for a PML loss (``deepmetric.losses.pml``)."""
    weight_decay: float = 0.0
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per parameter group (``pretrained``, ``new``, ``loss`` or a head's own): ``lr_scale`` and ``weight_decay``."""
    lr_schedule: str = "constant"
    """``constant`` (the papers), ``cosine`` (decay to 0 over ``steps``) or ``step`` (the rates are multiplied by
    ``lr_gamma`` at each of ``lr_milestones``: PyTorch's MultiStepLR, Caffe's ``multistep`` policy)."""
    lr_milestones: list[int] = field(default_factory=list)
    """Steps (0-based, increasing) from which ``step`` applies one more factor ``lr_gamma``."""
    lr_gamma: float = 0.1
    """The factor of the ``step`` schedule."""
    eval_every: int = 500
    select_by: str = "recall@1"
    """What validation selects the ``best`` checkpoint (and ``patience`` waits) by: ``recall@1`` (ties broken by
    MAP@R, then R-precision) or ``map@r`` (ties broken by Recall@1, then R-precision): on a validation split of a
    few dozen queries Recall@1 moves in coarse steps, where MAP@R uses every relevant image of each query."""
    patience: int = 0
    """Early stopping: stop once this many validations in a row (every ``eval_every`` steps) have not improved on
    the best one; 0 trains every step. A run stopped so stays stopped when resumed, unless given ``patience=0``."""
    checkpoint_every: int = 500
    log_every: int = 10
    seed: int = 0
    device: str = "auto"
    deterministic: bool = False
    """Ask torch for deterministic kernels (slower on GPU; CPU kernels already are)."""
    threads: int = 0
    """torch intra-op threads; 0 keeps torch's default."""
    amp: bool | str = False
    """Mixed precision of the training step's forward pass (``AMP_MODES``): ``bf16`` (bfloat16 autocast; ``true``
    means the same), ``fp16`` (float16 autocast with a gradient scaler: the loss is scaled before the backward pass,
    a step whose gradients overflow is skipped and the scale lowered, the skipped steps counted in the log) or
    ``false`` (float32). Weights, optimiser and the objective (every loss and regulariser) stay float32. bf16 for GPUs
    with fast bfloat16 (A100, H100), fp16 for those without (V100, T4); neither is faster than float32 on CPU
    (docs/benchmarks/training-step.md). fp16 does not combine with ``generator.name`` (``training.precision``)."""
    channels_last: bool = True
    """Run convolutions in channels-last (NHWC) layout: about 2x faster on CPU, same results up to float."""
    compile: bool = False
    """Compile the training step's forward and backward with ``torch.compile`` (``training.compiled``): the same
    losses up to float, minutes of compiling first; falls back to eager in one warning where the model cannot be
    compiled. Checkpoints, resume, evaluation and export are unaffected."""
    tensorboard: bool = False
    """Also write the log's scalars (loss terms, learning rates, images/s, validation metrics) as TensorBoard event
    files to ``RUN/tensorboard/`` (the extra ``deepmetric[tensorboard]``)."""


@dataclass
class EvalConfig:
    """Evaluation protocol."""

    recall_at: list[int] | None = None
    """Ranks K of Recall@K; None uses the data set's standard ranks."""
    batch_size: int = 128
    amp: bool | str = False
    """Mixed precision of every embedding pass (validation, test, ``embed``, ``index``, ``search``, ``serve``;
    ``models/inference.py``): ``bf16`` (bfloat16 autocast; ``true`` means the same), ``fp16`` (float16 autocast) or
    ``false`` (float32). Embeddings come back float32 and l2-normalised; their rankings may differ from float32's
    where two similarities differ by less than the low precision's rounding. For GPUs: on a CPU without bfloat16
    arithmetic bf16 was 8 times slower than float32 (docs/benchmarks/inference.md)."""
    compile: bool = False
    """Compile the model of every embedding pass with ``torch.compile`` (``models/compiled.py``): the same embeddings
    up to float, after a first batch that compiles (and the first of another size); falls back to eager in one
    warning where the model cannot be compiled. On 2 CPU cores Lite0 embedded 1.8 times as fast after 90 s of
    compiling (docs/benchmarks/inference.md)."""
    nmi: bool = True
    engine: str = "auto"
    """kNN engine (KNN_ENGINES): torch, numpy (torch with numpy's BLAS products), faiss or cuda (torch on the GPU);
    auto is cuda where torch sees a CUDA device, else numpy on CPUs where torch's MKL is slow (not made by Intel,
    except AMD's first Zen cores), torch otherwise. All exact (they may order neighbours whose similarities differ
    by a float rounding error differently)."""
    baseline: bool = False
    """Before training, evaluate the untrained backbone's pooled features on the test split."""
    report: bool = True
    """After the test evaluation of ``deepmetric train``, write ``RUN/report.html`` (``deepmetric report``)."""


@dataclass
class GeneratorConfig:
    """An example generator that adds synthetic rows to every batch (see ``deepmetric.generators``)."""

    name: str | None = None
    """``mirage`` (thesis ch. 6) or None: no generator, the plain pipeline."""
    options: dict[str, Any] = field(default_factory=dict)
    """The generator's options (e.g. MIRAGE's ``mode``, ``batch_ratio``, ``virtual_ratio``)."""


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_plain(v) for v in value]
    return value

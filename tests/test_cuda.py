"""Every registered plug-in on a CUDA device (skipped where torch sees none): each head with its paper's
regularisers, each loss, each regulariser not tied to a head and the generator trains a few steps on the GPU, in
float32, under bfloat16 autocast and under float16 autocast with the gradient scaler (``train.amp``; the generator
refuses fp16), and its checkpoint evaluates to the same figures as ``deepmetric evaluate``; a run stopped and
resumed on the GPU ends where an uninterrupted one does, an fp16 one with its scaler's state.

The CPU runs of the same cases are in ``test_resume.py`` and ``test_training.py``; these tests exist because the
GPU paths (device placement of every tensor a plug-in makes, the CUDA RNG state in checkpoints, autocast on CUDA,
the ``cuda`` kNN engine) never run on a machine without one.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from deepmetric.errors import ConfigError
from deepmetric.losses import LOSSES, REGULARIZERS
from deepmetric.models.heads import HEADS
from helpers import (
    assert_resumed_exactly,
    make_table,
    reads_made_by_deepmetric,
    tiny_config,
    train_straight_and_resumed,
)
from test_resume import CASES as RESUME_CASES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts in this process (resume tests)

STEPS = 5
DEML = {"head": "deml", "head_options": {"num_scales": 2, "num_branches": 2}}
# every head with its default options and its paper's regularisers
CASES = {f"head-{name}": {"model": {"head": name}} for name in HEADS}
CASES["head-jcf"]["model"]["head_options"] = {"init_images": 24}
CASES["head-deml"]["model"] = DEML
# every built-in loss, and two of pytorch-metric-learning's (one with parameters of its own: the proxies)
CASES.update({f"loss-{name}": {"loss": {"name": name}} for name in LOSSES.names() if ":" not in name})
CASES["loss-margin-per-class"] = {"loss": {"name": "margin", "options": {"per_class": True}}}
CASES["loss-pml-contrastive"] = {"loss": {"name": "pml:ContrastiveLoss"}}
CASES["loss-pml-proxy-anchor"] = {"loss": {"name": "pml:ProxyAnchorLoss"}}
# the regularisers, each on a head that gives it what it reads
REGULARIZER_HEADS = {"divergence": {"head": "abe"}, "diversity": {"head": "dgml"}, "horde": {"head": "gap"},
                     "deml-adversary": DEML, "deml-hinge": DEML, "activation-decay": DEML,
                     "learner-row-norm": DEML}
CASES.update({f"regularizer-{name}": {"model": REGULARIZER_HEADS[name],
                                      "loss": {"regularizers": {name: {"weight": 0.5}}}}
              for name in REGULARIZERS.names()})
CASES["regularizer-horde"]["loss"]["regularizers"]["horde"].update({"orders": 3, "dim": 32})
CASES["generator-mirage"] = {"generator": {"name": "mirage", "options": {"diagnostic_images": 0}}}


def _on_cuda(case: dict, **train) -> dict:
    return {**case, "train": {**case.get("train", {}), "device": "cuda", **train}}


def test_every_regulariser_has_a_case():
    assert set(REGULARIZER_HEADS) == set(REGULARIZERS.names())


@pytest.mark.parametrize("amp", [False, "bf16", "fp16"], ids=["float32", "bf16", "fp16"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_plug_in_trains_on_cuda_and_evaluates(tmp_path, case, amp):
    from deepmetric.training import train
    from deepmetric.workflows import evaluate_run

    if "pml" in case:
        pytest.importorskip("pytorch_metric_learning")
    if amp == "fp16" and "generator" in CASES[case]:
        with pytest.raises(ConfigError, match="train.amp=fp16 does not combine with generator.name"):
            tiny_config(**_on_cuda(CASES[case], steps=STEPS, amp=amp))
        return
    config = tiny_config(**_on_cuda(CASES[case], steps=STEPS, amp=amp))
    train(config, tmp_path / "run", progress=False)
    log = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines() if line.strip()]
    losses = [record["loss"] for record in log if "loss" in record]
    assert len(losses) == STEPS and all(math.isfinite(loss) for loss in losses)
    assert json.loads((tmp_path / "run/environment.json").read_text())["sessions"][-1]["device"].startswith("cuda")
    record = evaluate_run(tmp_path / "run", progress=False)  # on the GPU, with the cuda kNN engine (auto)
    assert record["environment"]["device"].startswith("cuda") and record["environment"]["knn_engine"] == "cuda"
    metrics = {k: v for k, v in record["metrics"].items() if v is not None}
    assert {"recall@1", "map@r"} <= set(metrics) and all(0.0 <= v <= 1.0 for v in metrics.values()), metrics


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resuming_on_cuda_ends_where_an_uninterrupted_run_ends(tmp_path, case):
    """With ``train.deterministic`` (torch's deterministic kernels; cuBLAS's workspace fixed by
    ``CUBLAS_WORKSPACE_CONFIG``), the GPU run resumes bit for bit, as the CPU one does (``test_resume.py``)."""
    straight, resumed, _ = train_straight_and_resumed(tmp_path, 4, 2, **_on_cuda(RESUME_CASES[case],
                                                                                 deterministic=True))
    assert_resumed_exactly(straight, resumed, 4)


@pytest.mark.parametrize("case", ["gap", "abe", "deml"])
def test_resuming_on_cuda_without_deterministic_kernels_ends_within_float_tolerance(tmp_path, case):
    """Without deterministic kernels, atomics in some CUDA backward passes change the last bits of a sum from run to
    run; after 4 Adam steps of lr 1e-3 the weights still agree to well under one step's size."""
    (a, _), (b, _), _ = train_straight_and_resumed(tmp_path, 4, 2, **_on_cuda(RESUME_CASES[case]))
    for key in (k for k in a if k.startswith("model.")):
        torch.testing.assert_close(b[key], a[key], rtol=1e-4, atol=1e-4, msg=key)


def test_the_image_cache_lives_on_the_gpu_and_its_crops_are_the_cpus(tmp_path):
    """``data.cache`` on CUDA: the decoded images are kept on the GPU, the batched augmentation there gives the CPU's
    crops (to one 8-bit level: float rounding), and a cached run resumes exactly."""
    from deepmetric.data.batched_transforms import BatchedTrainTransform
    from deepmetric.data.cache import ImageCache

    table = make_table(n_classes=4, per_class=4, size=40)
    cache = ImageCache.build(table, 16, (0.8, 1.5), "square", "cuda")
    assert cache.device.type == "cuda" and all(i.is_cuda for i in cache.images)
    augment, seeds = BatchedTrainTransform(16, (0.8, 1.5), pad="square"), list(range(len(table)))
    on_gpu = augment(cache.images, cache.shapes, seeds, "cuda")
    on_cpu = augment([i.cpu() for i in cache.images], cache.shapes, seeds, "cpu")
    assert on_gpu.is_cuda and (on_gpu.cpu() - on_cpu).abs().max() <= 1 / 255 + 1e-6
    straight, resumed, _ = train_straight_and_resumed(tmp_path, **_on_cuda({"data": {"cache": True}},
                                                                           deterministic=True))
    assert_resumed_exactly(straight, resumed, 4)


def test_the_colour_jitter_on_the_gpu_is_the_cpus(tmp_path):
    """``data.color_jitter`` on CUDA: the batch's jitter there gives the CPU's (to float rounding, then levels), the
    cached batches with jitter are the CPU's to the crops' level as the jitter amplifies it, and a cached, jittered
    run resumes exactly."""
    import numpy as np

    from deepmetric.data.batched_transforms import BatchedTrainTransform
    from deepmetric.data.cache import ImageCache
    from deepmetric.data.color_jitter import color_jitter, draw_jitter

    images = torch.rand(24, 3, 20, 20, generator=torch.Generator().manual_seed(0))
    rng = np.random.default_rng(0)
    draws = [draw_jitter(rng, (0.4, 0.4, 0.4, 0.5)) for _ in range(24)]
    assert (color_jitter(images.cuda(), draws).cpu() - color_jitter(images, draws)).abs().max() < 1e-5
    table = make_table(n_classes=4, per_class=4, size=40)
    cache = ImageCache.build(table, 16, (0.8, 1.5), "size", "cuda")
    augment, seeds = BatchedTrainTransform(16, (0.8, 1.5), color_jitter=(0.4, 0.4, 0.4, 0.1)), list(range(len(table)))
    on_gpu = augment(cache.images, cache.shapes, seeds, "cuda")
    on_cpu = augment([i.cpu() for i in cache.images], cache.shapes, seeds, "cpu")
    assert on_gpu.is_cuda and (on_gpu.cpu() - on_cpu).abs().max() <= 8 / 255 + 1e-6
    data = {"cache": True, "color_jitter": [0.4, 0.4, 0.4, 0.1]}
    straight, resumed, _ = train_straight_and_resumed(tmp_path, **_on_cuda({"data": data}, deterministic=True))
    assert_resumed_exactly(straight, resumed, 4)


@pytest.mark.parametrize("case", ["gap", "abe", "deml", "horde"])
def test_an_fp16_run_resumed_on_cuda_ends_where_an_uninterrupted_one_ends(tmp_path, case):
    """fp16 on the GPU: the CUDA gradient scaler's state comes back from ``last``; 20 steps against 14 + resume, with
    steps both skipped and taken before the stop (the tiny trunk's first gradients overflow float16 at 2^16; ABE's,
    its loss about 100, until the scale is down to 2^5: its first 10 steps are skipped, on the CPU as on an H200)."""
    straight, resumed, interrupted = train_straight_and_resumed(
        tmp_path, 20, 14, **_on_cuda(RESUME_CASES[case], deterministic=True, amp="fp16"))
    assert_resumed_exactly(straight, resumed, 20)
    assert 0 < interrupted[1]["amp"]["skipped_steps"] < 14  # skipped and taken before the stop
    assert interrupted[1]["amp"]["skipped_steps"] <= straight[1]["amp"]["skipped_steps"]


def test_the_cuda_scaler_skips_a_step_with_an_inf_gradient_and_counts_it():
    from deepmetric.training.precision import Precision
    from test_amp import InfGradient

    device = torch.device("cuda")
    model = torch.nn.Linear(4, 2).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    precision = Precision("fp16", device)
    assert not precision.backward_and_step(InfGradient.apply(model(torch.ones(3, 4, device=device))), optimizer, 1)
    assert torch.equal(before, model.weight) and not optimizer.state
    assert precision.log_fields() == {"skipped_steps": 1, "loss_scale": 2.0**15}
    optimizer.zero_grad()
    assert precision.backward_and_step(model(torch.ones(3, 4, device=device)).sum(), optimizer, 2)
    assert not torch.equal(before, model.weight) and precision.skipped == 1


def test_a_loss_that_overflows_float16_trains_finite_under_fp16_on_cuda(tmp_path):
    """The objective runs in float32 on the GPU too: ``exp(35 s)`` (infinite in float16) gives finite losses."""
    from deepmetric.training import train
    from test_amp import ExpSum

    LOSSES.register("exp-sum", ExpSum)
    try:
        train(tiny_config(loss={"name": "exp-sum"}, train={"device": "cuda", "steps": 3, "amp": "fp16"}),
              tmp_path / "run", progress=False)
    finally:
        LOSSES.unregister("exp-sum")
    log = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in log if "loss" in r)


def test_uint8_pixels_become_on_the_gpu_the_floats_the_cpu_makes():
    """The GPU's loaders carry uint8 (``uint8_batches``); made floats there, every pixel value is the CPU's
    correctly rounded v / 255 (not the product with 1/255 torch's CUDA kernels use for a Python divisor)."""
    from deepmetric.data.torch_dataset import uint8_batches
    from deepmetric.data.transforms import as_unit_float

    values = torch.arange(256, dtype=torch.uint8).reshape(1, 1, 16, 16)
    assert uint8_batches("cuda") and torch.equal(as_unit_float(values.cuda()).cpu(), as_unit_float(values))


@pytest.mark.parametrize("amp", [False, "bf16"])
def test_a_training_step_on_cuda_reads_one_value_back_the_loss(tmp_path, monkeypatch, amp):
    """``test_training.py``'s count on the GPU, where each read waits for the work queued before it: six more steps,
    six more reads (the loss, before the backward pass is queued)."""
    from deepmetric.training import train

    def reads(steps: int) -> int:
        config = tiny_config(train={"device": "cuda", "steps": steps, "amp": amp, "eval_every": 1000,
                                    "checkpoint_every": 1000, "log_every": 1000})
        return reads_made_by_deepmetric(monkeypatch, lambda: train(config, tmp_path / f"run{steps}", progress=False))

    assert reads(10) - reads(4) == 6


# --- DDP on one GPU (issue 52 item 6): two ranks share cuda:0, their CUDA tensors carried by gloo ----------------

def _ddp_config(steps: int) -> dict:
    return tiny_config(train={"steps": steps, "threads": 1, "device": "cuda:0", "checkpoint_every": 2},
                       loss={"name": "margin"}, model={"head": "abe", "head_options": {"num_learners": 2}})


def test_two_processes_on_one_gpu_train_and_resume_as_one_process_on_the_global_batch(tmp_path):
    """2 ranks x 6 images against 1 process x 12 images, both on cuda:0: the same weights and losses after 3 steps,
    and again after both resume to 5. NCCL refuses two ranks on one GPU; ``launch`` tells them this machine runs
    more ranks than it has GPUs, so gloo carries the CUDA tensors (``process_group_backend``)."""
    from deepmetric.runs.folder import RunDir
    from deepmetric.training import train
    from deepmetric.training.launch import launch
    from helpers import checkpoint

    if torch.cuda.device_count() != 1:
        pytest.skip("two ranks on one GPU: a machine with one GPU")
    for steps, resume in ((3, False), (5, True)):
        train(_ddp_config(steps), tmp_path / "one", resume=resume, progress=False)
        launch(_ddp_config(steps), tmp_path / "two", nproc=2, resume=resume, progress=False)
        (a, a_state), (b, b_state) = (checkpoint(tmp_path / run / "checkpoints/last.safetensors")
                                      for run in ("one", "two"))
        assert a_state["step"] == b_state["step"] == steps
        for key in a:
            if key.startswith("model."):
                torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
        losses = [[r["loss"] for r in RunDir(tmp_path / run).read_log() if "loss" in r] for run in ("one", "two")]
        assert losses[0] == pytest.approx(losses[1], rel=1e-4, abs=1e-5)
    sessions = json.loads((tmp_path / "two/environment.json").read_text())["sessions"]
    assert all(s["device"].startswith("cuda") for s in sessions)


def _embed_on_rank_on_cuda(rank: int, world: int, port: int, out: str) -> None:
    from deepmetric import create_model
    from deepmetric.distributed import context_from_env, shutdown
    from deepmetric.evaluation.evaluator import EmbedSettings, embed_table

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    context = context_from_env()
    try:
        torch.manual_seed(0)
        model = create_model("tiny", pretrained=False, embedding_dim=8).to("cuda:0")
        embeddings = embed_table(model, make_table(n_classes=3, per_class=5),
                                 EmbedSettings(16, batch_size=4, progress=False, device="cuda:0"), context=context)
        import numpy as np

        np.save(os.path.join(out, f"rank{rank}.npy"), embeddings)
    finally:
        shutdown()


def test_sharded_evaluation_on_one_gpu_gives_every_rank_all_rows_in_order(tmp_path):
    """15 rows embedded by 2 ranks on cuda:0 (8 + 7: the gather pads one shard): each rank holds the single process's
    matrix, no row missing, none twice."""
    import numpy as np
    import torch.multiprocessing as mp

    from deepmetric import create_model
    from deepmetric.distributed import free_port
    from deepmetric.evaluation.evaluator import EmbedSettings, embed_table

    mp.spawn(_embed_on_rank_on_cuda, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    model = create_model("tiny", pretrained=False, embedding_dim=8).to("cuda:0")
    single = embed_table(model, make_table(n_classes=3, per_class=5),
                         EmbedSettings(16, batch_size=4, progress=False, device="cuda:0"))
    assert single.shape == (15, 8) and len(np.unique(single.round(5), axis=0)) == 15
    for rank in range(2):
        np.testing.assert_allclose(np.load(tmp_path / f"rank{rank}.npy"), single, atol=1e-5)


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_the_embedding_pass_runs_under_autocast_on_cuda(amp):
    """``eval.amp`` on a GPU: float32 unit rows near float32's, not float32's."""
    import numpy as np

    from deepmetric import create_model
    from deepmetric.evaluation.evaluator import EmbedSettings, embed_table

    model = create_model("tiny", pretrained=False, embedding_dim=16).to("cuda:0")
    table = make_table()
    plain = embed_table(model, table, EmbedSettings(24, progress=False, device="cuda:0"))
    low = embed_table(model, table, EmbedSettings(24, progress=False, device="cuda:0", amp=amp))
    assert low.dtype == np.float32 and np.abs(low - plain).max() < 0.05 and not np.array_equal(low, plain)
    np.testing.assert_allclose(np.linalg.norm(low, axis=1), 1.0, atol=1e-5)


def test_the_embedding_pass_waits_for_the_gpu_once_not_every_batch():
    """``embed_outputs`` queues each batch's copy to the host (``to_host_queued``) instead of waiting for its forward
    pass: the waits torch's sync check reports do not grow with the number of batches (2 against 12), and the rows
    are the CPU's."""
    import warnings

    import numpy as np

    from deepmetric import create_model
    from deepmetric.evaluation.evaluator import EmbedSettings, embed_table

    model = create_model("tiny", pretrained=False, embedding_dim=16)
    on_gpu = EmbedSettings(24, batch_size=2, progress=False, device="cuda:0")

    def syncs(rows: int) -> tuple[int, np.ndarray]:
        table = make_table(n_classes=rows // 2, per_class=2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                embeddings = embed_table(model.to("cuda:0"), table, on_gpu)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught), embeddings

    embed_table(model.to("cuda:0"), make_table(n_classes=2, per_class=2), on_gpu)  # cuDNN's first choices
    few, _ = syncs(4)
    many, embeddings = syncs(24)
    assert many <= few, (few, many)
    on_cpu = embed_table(model.to("cpu"), make_table(n_classes=12, per_class=2),
                         EmbedSettings(24, batch_size=2, progress=False))
    np.testing.assert_allclose(embeddings, on_cpu, atol=1e-4)


def test_demls_boxes_found_on_the_gpu_are_scipys():
    """``attention_boxes`` on CUDA maps runs the device path (no copy of the maps to the host): the boxes SciPy finds
    for the same maps on the host, DeML's kind (smooth bumps resized to 224 x 224) and noisy ones."""
    import numpy as np
    import torch.nn.functional as F

    from deepmetric.models.heads.deml_oam import attention_box, attention_boxes

    g = torch.Generator().manual_seed(0)
    smooth = F.interpolate(torch.rand(24, 1, 14, 14, generator=g), size=(224, 224), mode="bilinear",
                           align_corners=False).squeeze(1)
    noisy = (torch.rand(8, 40, 40, generator=g) < 0.3).float()  # many small components, some equally large
    for maps in (smooth, noisy):
        found = attention_boxes(maps.to("cuda"))
        assert found.device.type == "cuda"
        expected = [list(attention_box(m)) for m in maps.numpy().astype(np.float32)]
        assert found.int().tolist() == expected

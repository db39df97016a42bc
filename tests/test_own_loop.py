"""docs/own-loop.md runs as written, as tests/test_docs.py runs a page (its blocks in order, in one namespace, in a
scratch folder): the plain PyTorch loop built from deepmetric's parts gives the figures of ``deepmetric train`` on
the same tiny case and seed, bit for bit (every step's loss, every validation, the best model's test figures), and
the Lightning loop gives the plain loop's (skipped without Lightning, an optional extra). Also the public entry
points the page uses that the trainer did not expose before (``create_objective``, ``seed_everything`` ...).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from test_docs import DOCS, RUNNABLE, _run_block, blocks

PAGE = DOCS / "own-loop.md"
THIS = "tests/test_own_loop.py"


def _page_blocks() -> tuple[list, list]:
    """The page's runnable blocks: those before the Lightning one, and the Lightning one(s)."""
    found = [b for b in blocks(PAGE) if b.language in RUNNABLE]
    lightning = [b for b in found if "import lightning" in b.body]
    return [b for b in found if b not in lightning], lightning


def test_every_block_of_the_page_is_run_here():
    """Each runnable block of the page says this test runs it (so tests/test_docs.py leaves it to this one), and the
    two groups run here cover them all: the plain loop with deepmetric train, and Lightning after them."""
    plain, lightning = _page_blocks()
    assert len(lightning) == 1 and plain, (len(plain), len(lightning))
    for block in plain + lightning:
        assert block.marker is not None and block.marker["test"] == THIS, block.where
    languages = [b.language for b in plain]
    assert languages.count("bash") == 1 and languages.count("python") >= 3, languages
    assert lightning[0].line > max(b.line for b in plain)  # the page reads in order: Lightning comes last


@pytest.fixture(scope="module")
def page_run(tmp_path_factory):
    """The page's blocks before Lightning, run in a scratch folder: the parts, the plain loop, ``deepmetric train``
    with the same settings and the page's own comparison. Returns the folder and the page's namespace."""
    folder = tmp_path_factory.mktemp("own-loop")
    namespace: dict = {"__name__": "__docs__"}
    plain, _ = _page_blocks()
    with pytest.MonkeyPatch.context() as monkeypatch:
        printed = [_run_block(block, folder, namespace, monkeypatch) for block in plain]
    return folder, namespace, printed


def test_the_plain_loop_gives_the_figures_of_deepmetric_train(page_run):
    """Exact equality, not a tolerance: the loop draws the trainer's random numbers in the trainer's order on the
    same CPU arithmetic, so every step's loss, each validation and the test figures of the best model equal, as
    floats, what ``deepmetric train`` logged and evaluated for the same settings and seed."""
    folder, namespace, printed = page_run
    run = folder / "runs" / "own-loop"
    log = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in log if "loss" in record]
    losses = namespace["losses"]
    assert len(losses) == namespace["STEPS"] == 12
    assert [record["step"] for record in steps] == list(range(1, 13))
    assert [record["loss"] for record in steps] == losses
    assert losses[-1] < losses[0]  # the loop learns (the equality is not of two runs that do nothing)
    validations = [record for record in log if record.get("split") == "val"]
    assert [record["step"] for record in validations] == [6, 12]
    assert [{k: v for k, v in record.items() if k not in ("step", "split")} for record in validations] \
        == namespace["validation"]
    record = json.loads((run / "metrics.json").read_text())
    assert record["checkpoint"] == "best"
    assert record["metrics"] == namespace["test"]
    assert set(namespace["test"]) == {"recall@1", "recall@2", "recall@4", "recall@8", "map@r", "r_precision"}
    assert printed[-1].startswith("the same 12 losses, 2 validations and test figures as deepmetric train")


def test_a_different_seed_gives_different_figures(page_run):
    """The figures the page matches are the seed's: another seed gives another first loss (the equality is not of
    two runs that ignore it)."""
    _, namespace, _ = page_run
    parts, seed = namespace["parts"], namespace["SEED"]
    namespace["SEED"] = seed + 1  # what parts() reads
    try:
        model, objective, _, loader = parts()
    finally:
        namespace["SEED"] = seed
    images, labels, _ = next(iter(loader))
    assert objective(model(images), labels)[0].item() != namespace["losses"][0]


def test_the_lightning_loop_gives_the_plain_loops_figures(request, monkeypatch):
    """The page's LightningModule on the same parts: the same losses, validations and test figures as the plain loop
    (exactly: Lightning's automatic optimisation takes the same zero_grad, backward and Adam step)."""
    pytest.importorskip("lightning", reason="Lightning is not installed (pip install 'deepmetric[lightning]')")
    folder, namespace, _ = request.getfixturevalue("page_run")  # (skipped before the page is run)
    _, [block] = _page_blocks()
    namespace = dict(namespace)
    printed = _run_block(block, folder, namespace, monkeypatch)  # the block asserts the equality itself
    learner = namespace["learner"]
    assert learner.losses == namespace["losses"]
    assert learner.validation == namespace["validation"]
    assert namespace["lightning_test"] == namespace["test"]
    assert learner.global_step == namespace["STEPS"]
    assert "Lightning: the plain loop's figures" in printed


def test_the_trainer_parts_are_public():
    """What the page imports from the package's public modules, and what ``deepmetric.training`` names for a loop of
    one's own, are there (and ``ImageDataset`` is the torch dataset the trainer uses)."""
    import deepmetric.data
    import deepmetric.training
    from deepmetric.data.torch_dataset import ImageDataset

    assert deepmetric.data.ImageDataset is ImageDataset and "ImageDataset" in deepmetric.data.__all__
    for name in ("seed_everything", "build_model", "load_table", "initialize_head", "build_optimizer",
                 "apply_schedule", "selection_key"):
        assert callable(getattr(deepmetric.training, name)) and name in deepmetric.training.__all__, name


def _head(name: str = "gap", **options):
    import deepmetric

    torch.manual_seed(0)
    return deepmetric.create_model(backbone="tiny", head=name, embedding_dim=16, pretrained=False, **options)


def _output_and_labels(model):
    torch.manual_seed(1)
    images = torch.rand(8, 3, 16, 16)
    return model(images), torch.arange(4).repeat_interleave(2)


@pytest.mark.parametrize("loss, options, head, head_options", [
    ("binomial", None, "gap", {}),
    ("margin", {"margin": 0.3}, "gap", {}),  # a loss with per-class parameters
    ("triplet", None, "abe", {"num_learners": 2}),  # a head with its own default regulariser and per-part losses
])
def test_create_objective_is_the_run_configs_objective(loss, options, head, head_options):
    """``create_objective(head, name, options, num_classes=)`` builds what ``build_objective`` builds from a run
    config's ``loss`` section with those keys: the same terms, the same values, the same parameters."""
    from deepmetric.config import LossConfig
    from deepmetric.losses import build_objective, create_objective

    model = _head(head, **head_options)
    output, labels = _output_and_labels(model)
    by_name = create_objective(model.head, loss, options, num_classes=4)
    from_config = build_objective(LossConfig(name=loss, options=dict(options or {})), model.head, num_classes=4)
    assert by_name.on == from_config.on and by_name.parts_reduction == from_config.parts_reduction
    assert list(by_name.regularizers) == list(from_config.regularizers) and by_name.weights == from_config.weights
    assert by_name.num_classes == 4
    total, terms = by_name(output, labels)
    expected_total, expected_terms = from_config(output, labels)
    assert terms.keys() == expected_terms.keys() and torch.equal(total, expected_total)
    assert [n for n, _ in by_name.named_parameters()] == [n for n, _ in from_config.named_parameters()]
    if head == "abe":
        assert by_name.on == "parts" and "divergence" in terms  # the head's defaults were taken


def test_create_objective_takes_the_sections_other_keys():
    """``regularizers={}`` drops the head's defaults, ``on`` and ``parts_reduction`` override the head's choices,
    and a bad option is the config's one message naming the loss."""
    from deepmetric.errors import ConfigError
    from deepmetric.losses import create_objective

    head = _head("abe", num_learners=2).head
    bare = create_objective(head, "binomial", regularizers={}, on="embedding")
    assert not bare.regularizers and bare.on == "embedding"
    summed = create_objective(head, "binomial", parts_reduction="sum", regularizers={"divergence": {"weight": 0.5}})
    assert summed.parts_reduction == "sum" and summed.weights == {"divergence": 0.5}
    with pytest.raises(ConfigError, match="binomial"):
        create_objective(head, "binomial", {"alpah": 2.0})


def test_the_page_builds_the_trainers_model(page_run):
    """``parts()`` builds, after ``seed_everything``, the weights ``deepmetric train`` starts from: the run's
    ``build_model(config)`` under the same seed (the first loss being equal says it too; this names the model)."""
    from deepmetric.config import build_config
    from deepmetric.training import build_model, seed_everything

    _, namespace, _ = page_run
    model = namespace["parts"]()[0]
    seed_everything(namespace["SEED"])
    expected = build_model(build_config({"model": {"backbone": "tiny", "pretrained": False, "embedding_dim": 16}}))
    state = model.state_dict()
    for key, value in expected.state_dict().items():
        assert np.array_equal(state[key].numpy(), value.numpy()), key
        assert state[key].is_contiguous(memory_format=torch.channels_last) == value.is_contiguous(
            memory_format=torch.channels_last), key

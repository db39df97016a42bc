"""A training session's state in its checkpoints: ``last`` (everything an exact ``--resume`` needs) and ``best``
(the model and the objective at the best validation), and loading ``last`` back into a session: rank 0 reads it
and hands it to the other ranks (``read_last``), which need no copy of the run folder."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load as tensors_from_bytes
from safetensors.torch import save as tensors_to_bytes

from ..distributed import DistContext, broadcast_bytes, on_main
from ..errors import DeepMetricError
from ..io.tensors import optimizer_from_flat, optimizer_to_flat, prefixed, unprefixed
from ..runs.checkpoint import load_checkpoint, save_checkpoint
from ..runs.folder import RunDir

if TYPE_CHECKING:
    from .session import Session

Checkpoint = tuple[dict[str, torch.Tensor], dict[str, Any]]


def save_last(session: Session, step: int) -> None:
    """``last`` at ``step``: the model, the objective, Adam's moments, torch's generators, the best so far, and each
    optional part's own state (an example generator, fp16's gradient scaler)."""
    model, objective, optimizer, generator = session.model, session.objective, session.optimizer, session.generator
    optim_tensors, optim_meta = optimizer_to_flat(optimizer)
    tensors = {**prefixed("model", model.state_dict()), **prefixed("objective", objective.state_dict()),
               **prefixed("optim", optim_tensors), "rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"rng.cuda.{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    state = {"kind": "last", "step": step, "model_spec": model.spec, "objective_classes": objective.num_classes,
             "optimizer": optim_meta, "best": session.best, "stopped_early": session.stopped_early}
    if generator is not None:
        generator_tensors, state["generator"] = generator.checkpoint_state()
        tensors.update(prefixed("generator", generator_tensors))
    if session.precision.scaler is not None:
        state["amp"] = session.precision.state()
    memory_tensors, memory_state = objective.checkpoint_state()  # a cross-batch memory (loss.memory), if any
    if memory_state is not None:
        tensors.update(prefixed("memory", memory_tensors))
        state["memory"] = memory_state
    save_checkpoint(session.run.last, tensors, state)


def save_best(session: Session, step: int, metrics: dict[str, float]) -> None:
    """The model at its best validation score, with the objective's state (for evaluating auxiliary embeddings)."""
    model, objective = session.model, session.objective
    tensors = {**prefixed("model", model.state_dict()), **prefixed("objective", objective.state_dict())}
    save_checkpoint(session.run.best, tensors, {"kind": "best", "step": step, "model_spec": model.spec,
                                                "objective_classes": objective.num_classes,
                                                "val_recall@1": metrics["recall@1"], "val_map@r": metrics["map@r"],
                                                "val_r_precision": metrics["r_precision"]})


def read_last(run: RunDir, context: DistContext) -> Checkpoint:
    """``last``'s tensors and state, read by rank 0 and sent to every other rank (safetensors bytes and JSON, over
    the process group): under torch.distributed every rank resumes from rank 0's file, as from one shared folder, and
    a machine without the run folder resumes too. A checkpoint rank 0 cannot read stops every rank with its error."""
    checkpoint: list[Checkpoint] = []

    def read() -> None:
        checkpoint.append(load_checkpoint(run.last))

    on_main(context, read)
    if not context.enabled:
        return checkpoint[0]
    tensors, state = checkpoint[0] if context.is_main else ({}, {})
    state = json.loads(broadcast_bytes(json.dumps(state).encode() if context.is_main else None, context))
    payload = broadcast_bytes(tensors_to_bytes(tensors) if context.is_main else None, context)
    return (tensors if context.is_main else tensors_from_bytes(payload)), state


def resume_session(session: Session, checkpoint: Checkpoint) -> None:
    """Load ``last`` (``read_last``) into the session: model, objective (its cross-batch memory too), optimiser, fp16's
    gradient scaler, generator, RNG, step and best."""
    run, generator = session.run, session.generator
    tensors, state = checkpoint
    if generator is not None:
        if "generator" not in state:
            raise DeepMetricError(f"cannot resume {run.path} with a generator: its checkpoint has none (add the "
                                  "generator to a new run instead)")
        generator.load_checkpoint_state(unprefixed("generator", tensors), state["generator"])
    session.model.load_state_dict(unprefixed("model", tensors))
    session.objective.load_state_dict(unprefixed("objective", tensors))
    session.objective.load_checkpoint_state(unprefixed("memory", tensors), state.get("memory"))
    optimizer_from_flat(session.optimizer, unprefixed("optim", tensors), state["optimizer"])
    session.precision.load_state(state.get("amp"))
    torch.set_rng_state(tensors["rng.torch"])
    cuda_states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("rng.cuda."))]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    session.start_step = int(state["step"])
    session.best = state.get("best", {}) or {"score": None, "step": None}
    stopped = state.get("stopped_early")
    session.stopped_early = stopped if isinstance(stopped, int) and session.config.train.patience else None

"""``deepmetric train``: the config from ``--config``, the command line's ``key=value`` overrides and, for a user's
own folder or table without a config, the settings ``training.auto_recipe`` chooses; then the run, its test table
and its report."""

from __future__ import annotations

import argparse
import logging
import re
import time
from pathlib import Path
from typing import Any

from ..config import build_config, load_yaml, merge_layers
from ..config.layers import dotted_layer, parse_settings
from ..config.validate import SELECT_BY
from ..errors import ConfigError, DeepMetricError, MissingDataPath
from .commands import say

log = logging.getLogger(__name__)


def default_run_name(config: Any, now: float | None = None) -> str:
    """``<time>-<data>-<backbone>-<head>`` for a run without ``--out``: each part cut to letters, digits, ``.``,
    ``_``, ``-`` and 40 characters, never ``.`` or ``..`` (a ``--data`` or ``--backbone`` holding ``../`` named a
    folder outside ``runs/``)."""
    def part(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:40].strip("._") or "x"

    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return "-".join([stamp, part(config.data.spec.split(":")[0]), part(config.model.backbone),
                     part(config.model.head)])


def _settings(overrides: list[str]) -> dict[str, Any]:
    """The command line's ``key=value`` settings, in order (``parse_settings``); a preset, config or run given where
    a ``key=value`` goes is named first."""
    for text in overrides:
        if "=" not in text:
            _refuse_positional(text)
    return parse_settings(overrides)


def _train_layers(args: argparse.Namespace, base: dict[str, Any], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The command line's layers over ``base`` (the config file's, or the resumed run's): its flags, then its
    ``key=value`` ``settings``, each setting one value (``loss.regularizers.horde.weight=0.5`` keeps HORDE's other
    options and the other regularisers: ``dotted_layer``)."""
    flags: dict[str, Any] = {}
    pairs = [("data", "spec", args.data), ("model", "backbone", args.backbone), ("model", "head", args.head),
             ("loss", "name", args.loss), ("train", "steps", args.steps), ("generator", "name", args.generator)]
    if args.skip_bad_images:
        flags.setdefault("data", {})["skip_bad_images"] = True
    if args.trust_pickle:
        flags.setdefault("model", {})["trust_pickle"] = True
    for section, key, value in pairs:
        if value is not None:
            flags.setdefault(section, {})[key] = value
    return [flags, dotted_layer(settings, merge_layers(base, flags))]


def _refuse_positional(text: str) -> None:
    """``deepmetric train cub-googlenet-binomial`` (a preset or a config file) and ``deepmetric train runs/x`` (a
    run) put where a ``key=value`` goes: say which flag takes it (parse_setting's message says only the form)."""
    from ..presets import find_preset, resolve

    if (Path(text) / "config.yaml").is_file():
        raise DeepMetricError(f"'{text}' is a run; continue it with deepmetric train --resume --out {text}, or give "
                              "settings as key=value (e.g. train.steps=2000)")
    try:
        resolve(text)
    except ConfigError:
        if find_preset(text, "study") is not None:
            raise  # "... is a study, not a run config: run it with deepmetric study NAME"
        return  # parse_setting's own message
    raise DeepMetricError(f"'{text}' is a config; train it with deepmetric train --config {text} (then key=value "
                          "overrides, e.g. train.steps=2000)")


def _auto_recipe(config: Any, layers: list[dict[str, Any]]) -> Any:
    """``config`` with the settings ``training.auto_recipe`` chooses from a user's own data (a folder or CSV table
    given without ``--config``) below the command line's overrides; each choice said, with its reason."""
    from ..training.auto_recipe import applies_to, as_layer, auto_recipe

    if not applies_to(config.data.spec):
        return config
    from ..data import load_dataset

    d = config.data
    choices = auto_recipe(load_dataset(d.spec, seed=d.seed, check_counts=d.check_counts, check_files=False),
                          config.model.head)
    chosen = build_config(as_layer(choices), *layers)
    log.info("no --config: settings chosen from %s (docs/getting-started.md, 'Training on your own folder'):",
             config.data.spec)
    flat = chosen.to_dict()
    for choice in choices:
        section, key = choice.key.split(".", 1)
        value = flat[section][key]
        kept = (list(value) if isinstance(value, tuple) else value) == choice.value
        log.info("  %s%s", choice.line(), "" if kept else f" (your {choice.key}={value} wins)")
    return chosen


def _not_better_than_backbone(result: Any) -> str:
    """The plain words for a run whose selected checkpoint does not rank above the untrained backbone."""
    val, best = result.backbone_val, result.best_val
    return (f"training did not beat the untrained backbone on validation (Recall@1 {100 * best['recall@1']:.2f}%, "
            f"MAP@R {100 * best['map@r']:.2f}% at the selected step against {100 * val['recall@1']:.2f}% and "
            f"{100 * val['map@r']:.2f}% for the backbone): the backbone's own features retrieve these classes as "
            "well; docs/getting-started.md ('When training does not help') says what to try")


def _resume_config(out: str, context: Any) -> dict[str, Any]:
    """The saved config of the run to resume; under torchrun (``context``) read by rank 0 alone (``on_main``): the
    other machines need no copy of the run folder."""
    from ..runs.folder import RunDir

    if context is None:
        return RunDir(out).config().to_dict()
    import socket

    from ..distributed import on_main

    def read() -> dict[str, Any]:
        try:
            return RunDir(out).config().to_dict()
        except DeepMetricError as error:
            raise DeepMetricError(f"{error} on rank 0 (host {socket.gethostname()}). Rank 0 reads and writes the run "
                                  "folder: run rank 0 on the machine that holds it (docs/cli.md, 'Training on "
                                  "several machines')") from None

    return on_main(context, read)


def cmd_train(args: argparse.Namespace) -> int:
    settings = _settings(args.overrides)
    context = _torchrun_context()
    # Under torchrun every rank leaves the process group before the interpreter exits, trained or failed: a group
    # left to the exit's destructors aborted a worker now and then ("terminate called without an active
    # exception"), and torchrun then failed every machine.
    try:
        return _train(args, settings, context)
    finally:
        if context is not None:
            from ..distributed import shutdown

            shutdown()


def _train(args: argparse.Namespace, settings: dict[str, Any], context: Any) -> int:
    """``deepmetric train`` once its settings are read and, under torchrun, this process has joined the group."""
    if args.resume:
        if not args.out:
            raise DeepMetricError("--resume needs --out RUN_DIR")
        if args.config:
            raise DeepMetricError("--resume continues the run's saved config.yaml; change settings with "
                                  "key=value overrides instead of --config")
        base = _resume_config(args.out, context)
    else:
        base = load_yaml(args.config) if args.config else {}
    layers = _train_layers(args, base, settings)
    config = build_config(base, *layers)  # a bad setting stops here, before the model code's imports (~5 s)
    from ..data import check_data_path

    def check_data() -> None:
        try:
            check_data_path(config.data.spec)  # a missing data folder too (train checks it again, for library callers)
        except MissingDataPath as error:
            name = config.data.spec.split(":", 1)[0]
            raise MissingDataPath(f"{error} (give where it is with --data {name}:PATH; docs/data.md has each data "
                                  "set's layout and download)") from None

    if context is None:
        check_data()
    else:  # a machine without the data stops every machine, saying which
        from ..distributed import agreed

        agreed(context, check_data)
    if not args.resume and not args.config:
        config = _auto_recipe(config, layers)
    from ..training import train
    from ..workflows import add_regularizers, evaluate_run_embeddings, results_table

    if args.regularizer:
        add_regularizers(config, args.regularizer)
    if args.no_test and config.eval.baseline:  # the untrained backbone's test figures would be computed, never shown
        config.eval.baseline = False
    out = Path(args.out) if args.out else Path("runs") / default_run_name(config)
    if context is not None:  # the name rank 0 chose (the time in a default name differs between machines)
        from ..distributed import on_main

        out = Path(on_main(context, lambda: str(out)))
    if args.nproc > 1:
        from ..training.launch import launch

        if context is not None:
            raise DeepMetricError("--nproc starts processes on this machine; under torchrun give --nproc-per-node "
                                  "to torchrun instead")
        started = time.perf_counter()
        launch(config, out, args.nproc, resume=args.resume, progress=not args.quiet)
        say(f"trained {config.train.steps} steps with {args.nproc} processes in "
              f"{(time.perf_counter() - started) / 60:.1f} min; run directory {out}")
    else:
        result = train(config, out, resume=args.resume, progress=not args.quiet)
        if context is not None and not context.is_main:  # under torchrun, rank 0 alone holds the run and evaluates
            log.info("rank %d: trained to step %d; rank 0 holds the run directory", context.rank, result.steps)
            return 0
        done = result.steps - result.start_step
        if result.steps == 0:  # the model as built: with model.embedding_dim=0, the backbone's pooled features
            say(f"train.steps=0: nothing trained; {result.run_dir} holds the model as built")
        elif done <= 0:
            say(f"nothing to train: {result.run_dir} had reached step {result.start_step} of {result.steps}")
        else:
            resumed = f" (steps {result.start_step + 1}-{result.steps}, resumed)" if result.start_step else ""
            say(f"trained {done} steps{resumed} in {result.seconds / 60:.1f} min; run directory {result.run_dir}")
        if result.best_step is not None and result.best_score is not None:
            say(f"best validation {SELECT_BY[config.train.select_by]} {100 * result.best_score:.2f}% at step "
                f"{result.best_step}")
        if result.beats_backbone is False:
            say(_not_better_than_backbone(result))
    if not args.no_test:
        record, embeddings = evaluate_run_embeddings(out, progress=not args.quiet)
        say(results_table(out, record))
        if config.eval.report:
            from ..report import build_report

            say(f"report: {build_report(out, progress=not args.quiet, test_embeddings=embeddings)}")
    return 0


def _torchrun_context() -> Any:
    """Under torchrun (``WORLD_SIZE`` > 1 in the environment), this process's rank in the process group, joined now:
    rank 0 reads the run to resume and every rank checks its data before training, each outcome shared; else None."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    from ..distributed import context_from_env

    return context_from_env()

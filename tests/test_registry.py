"""The one ``Registry`` that every kind of plug-in is found through."""

from __future__ import annotations

import pytest

from deepmetric.errors import ConfigError, DataError
from deepmetric.registry import Registry


class Scaled:
    def __init__(self, factor: float, num_classes: int | None = None, offset: float = 0.0):
        self.factor, self.num_classes, self.offset = factor, num_classes, offset


def make() -> Registry:
    registry = Registry("widget", provided=("num_classes",), extra_options=("weight",))
    registry.register("scaled", Scaled)

    @registry.register("const")
    def const(value: int = 3) -> int:
        return value

    return registry


def test_names_options_and_build_pass_provided_values_only_where_asked():
    registry = make()
    assert registry.names() == ["scaled", "const"] and "scaled" in registry and "nope" not in registry
    assert registry.options("scaled") == ["weight", "factor", "offset"]  # provided arguments are not options
    built = registry.build("scaled", {"factor": 2.0, "weight": 0.5}, num_classes=7)
    assert (built.factor, built.num_classes, built.offset) == (2.0, 7, 0.0)  # weight is not passed on
    assert registry.build("const", {"value": 5}, num_classes=7) == 5  # const does not ask for num_classes


def test_unknown_names_and_options_are_refused_with_the_nearest_valid_one():
    registry = make()
    with pytest.raises(ConfigError, match=r"unknown widget 'scaeld' \(did you mean 'scaled'\?\); expected one of "
                                          r"scaled, const"):
        registry.get("scaeld")
    with pytest.raises(ConfigError, match=r"widget 'scaled' has no option 'ofset' \(did you mean 'offset'\?\); its "
                                          r"options are: weight, factor, offset"):
        registry.check("scaled", {"ofset": 1})
    with pytest.raises(ConfigError, match=r"unknown widget 'CONST' \(did you mean 'const'\?\)"):  # the paper's
        registry.get("CONST")  # capitals (model.head=DGML) were suggested nothing


def test_a_missing_required_option_is_a_config_error_but_a_constructor_bug_is_not():
    registry = make()
    with pytest.raises(ConfigError, match="widget 'scaled': missing a required argument: 'factor'"):
        registry.build("scaled", {})

    def broken(value: int = 1) -> int:
        return len(value)  # a TypeError inside the entry is a bug and keeps its type

    registry.register("broken", broken)
    with pytest.raises(TypeError, match="has no len"):
        registry.build("broken")


def test_registering_a_name_twice_is_refused_and_unregister_removes_it():
    registry = make()
    registry.register("scaled", Scaled)  # the same entry again is harmless
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("scaled", object)
    assert registry.unregister("scaled") is Scaled and "scaled" not in registry


def test_prefixes_serve_names_no_table_lists_and_the_error_class_is_the_registrys():
    registry = Registry("data set", error=DataError)
    registry.register_prefix("ext", lambda rest: f"external {rest}")
    assert registry.get("ext:thing") == "external thing" and "ext:thing" in registry
    assert registry.names() == ["ext:<name>"]
    with pytest.raises(DataError, match="unknown data set 'ext:'"):
        registry.get("ext:")


def test_every_kind_of_plug_in_is_found_through_a_registry():
    from deepmetric.data import DATASETS
    from deepmetric.generators import GENERATORS
    from deepmetric.losses import LOSSES, REGULARIZERS
    from deepmetric.models.backbones import BACKBONES
    from deepmetric.models.heads import HEADS

    for registry, name in ((DATASETS, "cub"), (GENERATORS, "mirage"), (LOSSES, "binomial"),
                           (REGULARIZERS, "horde"), (BACKBONES, "lite0"), (HEADS, "abe")):
        assert isinstance(registry, Registry) and name in registry
    assert "timm:resnet18" in BACKBONES

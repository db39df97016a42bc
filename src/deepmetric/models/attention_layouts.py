"""Where the attention heads (ABE, DIABLO) cut each backbone: the trunk's end and the stages their attention
modules phi copy."""

from __future__ import annotations

from ..errors import ConfigError

# Where the attention heads cut each backbone (DIABLO thesis §4.4.7.1, ABE §4): for ``pre``-attention the
# trunk F ends where the GoogLeNet's pool3 does and phi is a copy of the blocks that follow at the same
# resolution (inception 4a-4e); for ``post``-attention F ends at pool4 and phi copies inception 5a-5b.
# The other backbones take the analogous cut: the end of a scale, phi = the next blocks of that scale.
ATTENTION_LAYOUTS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "googlenet": {"pre": ("pool3", ("inception4a", "inception4b", "inception4c", "inception4d", "inception4e")),
                  "post": ("pool4", ("inception5a", "inception5b"))},
    "lite0": {"pre": ("stage4", ("stage5",)), "post": ("stage6", ("stage7", "head"))},
    "resnet50": {"pre": ("layer2", ("layer3",)), "post": ("layer3", ("layer4",))},
    "tiny": {"pre": ("stage1", ("stage2",)), "post": ("stage2", ("stage3",))},
}
ATTENTION_LAYOUTS["inception-v1"] = ATTENTION_LAYOUTS["googlenet"]
# BN-Inception's stride-16 blocks are 4a-4d (3c and 4e downsample themselves).
ATTENTION_LAYOUTS["bn-inception"] = {
    "pre": ("inception3c", ("inception4a", "inception4b", "inception4c", "inception4d")),
    "post": ("inception4e", ("inception5a", "inception5b")),
}


def attention_layout(backbone: str, strategy: str) -> tuple[str, tuple[str, ...]]:
    """``(split point, phi's stages)`` of an attention head with ``strategy`` (pre/post) on ``backbone``."""
    if strategy not in ("pre", "post"):
        raise ConfigError(f"attention strategy must be 'pre' or 'post', got '{strategy}'")
    if backbone not in ATTENTION_LAYOUTS:
        raise ConfigError(f"attention heads have no split defined for backbone '{backbone}'; they work on "
                          f"{', '.join(ATTENTION_LAYOUTS)} (or pass model.split and the head option phi_stages)")
    return ATTENTION_LAYOUTS[backbone][strategy]

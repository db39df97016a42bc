"""mkdocs hooks for the documentation site (mkdocs.yml's ``hooks:``).

The pages in docs/ are read on GitHub as well as on the site, so they link to the repository's own files with
relative paths that leave docs/ (``../src/deepmetric/configs``, ``../benchmarks/gpu_checklist.sh``) and to folders
(``studies/emoji/``). On GitHub those links work; the site holds only docs/ and has no page for a folder. This hook
checks that each such target exists in the repository (a missing one is a warning, so ``mkdocs build --strict``
fails on it, as on a broken link between pages) and turns the link into its text followed by the repository path,
since the site has nothing to link to.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.repository_links")

# [text](target) with a relative target (no scheme, not an anchor alone); images (![...]) are left to mkdocs
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]+)\]\((?P<target>(?![a-z][a-z0-9+.-]*:|#)[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,}).*?^\1\2[ \t]*$", flags=re.M | re.S)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    root = docs_dir.parent
    page_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target = match["target"]
        inside = posixpath.normpath(posixpath.join(page_dir, target))
        path = (docs_dir / inside).resolve()
        if not inside.startswith("../") and not path.is_dir():
            return match[0]  # a page or file of the site: mkdocs checks it
        try:
            shown = path.relative_to(root).as_posix()
        except ValueError:
            log.warning(f"{page.file.src_uri}: the link '{target}' leaves the repository")
            return match[0]
        if not path.exists():
            log.warning(f"{page.file.src_uri}: the link '{target}' names '{shown}', which is not in the repository")
            return match[0]
        text = match["text"]
        if path.name in text or shown.rstrip("/") in text:
            return text
        return f"{text} (`{shown}` in the repository)"

    # links inside fenced code are text, not links
    pieces, start = [], 0
    for fence in FENCE.finditer(markdown):
        pieces.append(LINK.sub(rewrite, markdown[start:fence.start()]))
        pieces.append(fence[0])
        start = fence.end()
    pieces.append(LINK.sub(rewrite, markdown[start:]))
    return "".join(pieces)

"""``icons``: the same freedesktop icon name (``printer``, ``user-trash``, ...) drawn by different artists' themes.

A class is one icon name; its instances are the drawings of it by the themes of fourteen pinned Debian packages
(``catalogue.PACKAGES``), each theme a vendor. On first use the package client fetches the ``.deb`` files
(``apt-get download NAME=VERSION`` in a temporary folder; each file's SHA-256 checked against the one the Debian
archive publishes, pinned in the table), each package's file tree is read as ``dpkg-deb --fsys-tarfile`` streams it,
nothing installed, the themes are read (``themes``), and the files of every name that at least four vendors draw
are written out of their packages and rendered at ``build.IMAGE_SIZE`` (SVGs with librsvg: ``render``),
copies are removed (``dedup``) and the rest written as PNGs to ``$DEEPMETRIC_DATA/icons/<vendor>/<name>.png`` with
``images.csv`` (what each image is), ``duplicates.csv`` (what was left out and why), each package's ``copyright`` file
and ``meta.json``. ``icons:PATH`` reads the fourteen ``.deb`` files from folder ``PATH`` instead (named as ``apt-get
download`` names them), with no network; they are checked every time, and a build of the same versions already there
is used rather than built again.

The images are the themes' artwork, read locally for research and never redistributed by this project; each
package's licence is its ``copyright`` file, kept in ``licences/`` (GPL, LGPL, CC BY and CC BY-SA; Tango's is in
the public domain).

The steps, one module each: ``catalogue`` (the pinned packages and the split), ``fetch`` (the ``.deb``
files, fetched or found, and checked), ``unpack`` (a package's file tree, streamed), ``themes`` (which
theme is a vendor and which file it draws for a name), ``render`` (drawing one file), ``dedup`` (the
copies left out) and ``build`` (rendering, deduplicating and writing the build atomically); ``table`` reads the
build as the data set's table (and registers ``icons`` with the data sets).
"""

from .table import PUBLISHED, PUBLISHED_FOR, RECALL_AT, load_icons, read_catalogue

__all__ = ["PUBLISHED", "PUBLISHED_FOR", "RECALL_AT", "load_icons", "read_catalogue"]

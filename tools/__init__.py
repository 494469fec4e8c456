"""The maintainers' tools of this repository (rendering and publishing the docs' numbers): not part of the
installed package, which never imports them. Run them from the repository root, e.g.
``python tools/render_docs.py --check``."""

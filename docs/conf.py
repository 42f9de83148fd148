"""Sphinx configuration: the docs are Markdown (MyST); ``tox -e docs`` builds them with -W."""

project = "amplifier-tools"
author = "amplifier-tools developers"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "alabaster"
suppress_warnings = ["myst.header"]

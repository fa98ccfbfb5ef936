"""Tools for working on the project, not part of the installed package: the docs generator."""

"""Data sets shipped with the package (see SOURCES.md here); loaded by dapo_core.data.loaders."""

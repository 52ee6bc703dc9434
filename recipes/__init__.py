"""The shipped recipes: these TOML files are installed as `tinyelectra.recipes` (package data; see pyproject.toml),
so an editable install, a wheel and `pip install .` all find them with importlib.resources (tinyelectra.config)."""

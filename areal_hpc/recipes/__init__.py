"""Recipes: whole procedures built from the components (the SFT warm start of the tiny model)."""

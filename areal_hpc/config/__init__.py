"""Experiment configuration: schema (dataclasses), loading (YAML + overrides), validation."""

from areal_hpc.config.load import load_config, save_config, to_yaml
from areal_hpc.config.schema import ExperimentConfig

__all__ = ["ExperimentConfig", "load_config", "save_config", "to_yaml"]
